"""The decode step's fused write-back kernel on CUDA == SlotTable.write_back's torch ops (run on the CPU), exactly,
at the 1.7B's hidden size in bf16 and in fp32; also replayed from a CUDA graph."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def _tables_equal(got, ref):
    real = slice(0, ref.h.shape[0] - 1)              # the scratch slot takes the padding rows' racing writes
    for name in ("h", "seen", "history", "c0", "fed"):
        assert torch.equal(getattr(got, name)[real].cpu(), getattr(ref, name)[real]), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_back_kernel_equals_the_torch_ops(dtype, monkeypatch):
    from test_kernel_slot_write_back import make_case
    from voxflow.kernels import use_kernels
    from voxflow.models.qwen3_tts import slots
    monkeypatch.setattr(slots, "WRITE_BACK_KERNEL", True)           # (whatever an A/B run's environment says)
    ref, ref_args, eos_id = make_case("cpu", dtype, hidden=2048, vocab=3072, slots=64, frames=512)
    got, args, _ = make_case("cuda", dtype, hidden=2048, vocab=3072, slots=64, frames=512)
    assert use_kernels(got.h), "the kernels are switched off here (VOXFLOW_KERNELS): nothing to test"
    assert got.write_back(*args, eos_id).cpu().tolist() == ref.write_back(*ref_args, eos_id).tolist()
    _tables_equal(got, ref)


def test_write_back_kernel_in_a_graph():
    from test_kernel_slot_write_back import make_case
    from voxflow.kernels.slot_write_back import slot_write_back
    got, args, eos_id = make_case("cuda", torch.bfloat16, hidden=2048, vocab=3072, slots=64, frames=512)
    ref, ref_args, _ = make_case("cpu", torch.bfloat16, hidden=2048, vocab=3072, slots=64, frames=512)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                                  # compile outside the capture
        slot_write_back(*[a.clone() for a in args], eos_id, got.c0.clone(), got.fed.clone(), got.h.clone(),
                        got.seen.clone(), got.history.clone())
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        flags = slot_write_back(*args, eos_id, got.c0, got.fed, got.h, got.seen, got.history)
    graph.replay()
    assert flags.cpu().tolist() == ref.write_back(*ref_args, eos_id).tolist()
    _tables_equal(got, ref)
