"""The decode step's fused talker-input kernel on CUDA == SlotTable.frame_input's torch ops (on the CPU), exactly,
at the 1.7B's hidden size in bf16 and fp32; also replayed from a CUDA graph."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frame_input_kernel_equals_the_torch_ops(dtype, monkeypatch):
    from test_kernel_frame_input import make_case
    from voxflow.models.qwen3_tts import slots
    monkeypatch.setattr(slots, "FRAME_INPUT_KERNEL", True)          # (in case the environment turned it off)
    from voxflow.kernels import use_kernels
    ref, ref_args = make_case("cpu", dtype, hidden=2048)
    got, args = make_case("cuda", dtype, hidden=2048)
    assert use_kernels(got.h), "the kernels are switched off here (VOXFLOW_KERNELS): nothing to test"
    want_x, want_pos = ref.frame_input(*ref_args)
    x, pos = got.frame_input(*args)
    assert torch.equal(x.cpu(), want_x) and torch.equal(pos.cpu(), want_pos)


def test_frame_input_kernel_in_a_graph():
    from test_kernel_frame_input import make_case
    from voxflow.kernels.frame_input import frame_input
    ref, (rows, fed, trailing_len, prompt_len, embed, pad) = make_case("cpu", torch.bfloat16, hidden=2048)
    got, args = make_case("cuda", torch.bfloat16, hidden=2048)
    d_rows, d_fed, d_trailing, d_prompt, d_embed, d_pad = args
    call = (lambda: frame_input(d_embed, d_rows, d_fed, d_trailing, d_prompt, got.text_table, got.text_pages,
                                d_pad))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                                  # compile outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x, pos = call()
    d_fed.add_(1)                                                  # the next step's inputs, in place
    fed.add_(1)
    graph.replay()
    want_x, want_pos = ref.frame_input(rows, fed, trailing_len, prompt_len, embed, pad)
    assert torch.equal(x.cpu(), want_x) and torch.equal(pos.cpu(), want_pos)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frame_input_kernel_sums_the_frames_rows_within_one_rounding(dtype):
    """With the frame's 16 embedding rows (predict's embed_parts): within one rounding of torch's stack + sum on the
    GPU (its own reduction order), in bf16 mostly the same bits (tests/test_kernel_frame_input.py's check)."""
    from test_kernel_frame_input import check_sum_of_rows_against_reference
    check_sum_of_rows_against_reference(dtype, 2048, device="cuda")
