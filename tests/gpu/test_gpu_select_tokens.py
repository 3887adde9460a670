"""The fused token-selection kernel on CUDA == batch_sampling's torch pipeline on CUDA, also inside a CUDA graph.

Without top-p every step is exact (IEEE division, sorted values, integer noise, libdevice logf as torch.log,
lowest-index argmax), so the ids must be equal. With top-p the kernel keeps the nucleus by value (all boundary
ties survive) and sums probabilities in another order, so a row may instead take the draw of the same pipeline
with a value-threshold nucleus (`warp_by_value`); anything else is a bug."""
import pytest
import torch

from test_kernel_select_tokens import make_case, reference  # tests/test_kernel_select_tokens.py

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def warp_by_value(l32, temperature, top_k, top_p):
    """warp_logits with the kernel's nucleus rule: keep the values >= the smallest one apply_top_p keeps."""
    from voxflow.models.qwen3_tts.sampling import apply_temperature, apply_top_k
    w = apply_top_k(apply_temperature(l32, temperature), top_k)
    ascending = torch.sort(w, dim=-1).values
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    kept = cumulative > (1.0 - top_p.to(torch.float64)).to(torch.float32)[:, None]
    kept[:, -1] = True
    threshold = torch.where(kept, ascending, float("inf")).amin(dim=-1)
    threshold = torch.where(top_p < 1.0, threshold, float("-inf"))
    return w.masked_fill(w < threshold[:, None], float("-inf"))


def check(got, args, codebook, use_top_p):
    """Asserts got is the reference's draw (or, on top-p rows, the value-threshold nucleus's); returns the number
    of rows that took the second."""
    from voxflow.models.qwen3_tts.batch_sampling import gumbel_argmax
    logits, do_sample, temperature, top_k, top_p, keys, frame = args
    want = reference(*args, codebook, use_top_p)
    assert got.dtype == torch.long and got.shape == want.shape
    if not use_top_p:
        assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
        return 0
    l32 = logits.to(torch.float32)
    alt = torch.where(do_sample, gumbel_argmax(warp_by_value(l32, temperature, top_k, top_p), keys, frame, codebook),
                      l32.argmax(dim=-1))
    differ = got != want
    assert bool((~differ | ((got == alt) & do_sample & (top_p < 1.0))).all()), differ.nonzero().flatten().tolist()
    return int(differ.sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [2048, 3072])
@pytest.mark.parametrize("batch", [1, 64])
def test_select_tokens_matches_reference_on_cuda(batch, vocab, dtype):
    from voxflow.kernels.select_tokens import select_tokens, supported
    g = torch.Generator().manual_seed(batch * 7 + vocab)
    rows = boundary = 0
    for step in range(16):
        for use_top_p in (False, True):
            args = make_case(g, batch, vocab, dtype, use_top_p, device="cuda")
            assert supported(args[0])
            got = select_tokens(*args, step, use_top_p)          # codebooks 0..15 (1: the specialisation trap)
            boundary += check(got, args, step, use_top_p)
            rows += batch
    assert boundary <= max(1, rows // 100), (boundary, rows)     # nucleus-boundary draws stay rare


def test_select_tokens_in_a_cuda_graph():
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(5)
    static = make_case(g, 64, 3072, torch.bfloat16, True, device="cuda")
    select_tokens(*static, 1, True)                              # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = select_tokens(*static, 1, True)
    for _ in range(3):
        for s, new in zip(static, make_case(g, 64, 3072, torch.bfloat16, True, device="cuda")):
            s.copy_(new)
        graph.replay()
        assert torch.equal(out, select_tokens(*static, 1, True))    # the replay read the new inputs
        check(out.clone(), static, 1, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 64])
def test_talker_processing_in_the_kernel_matches_select_c0(dtype, batch):
    """talker=: raw talker logits in, the same c0 ids as process_talker_logits + the torch draw (no top-p)."""
    from voxflow.kernels.select_tokens import select_tokens
    from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, process_talker_logits, suppress_mask
    g = torch.Generator().manual_seed(batch)
    for step in range(8):
        raw, do_sample, temperature, top_k, top_p, keys, frame = make_case(g, batch, 3072, dtype, False, "cuda")
        seen = (torch.rand(batch, 3072, generator=g) < 0.05).cuda()
        penalty = torch.tensor([1.0, 1.05, 1.3, 2.0], device="cuda")[torch.arange(batch) % 4]
        num_generated = torch.full((batch,), step, device="cuda")
        min_new_tokens = torch.tensor([0, 4, 2 ** 62], device="cuda")[torch.arange(batch) % 3]
        suppress = suppress_mask(3072, device="cuda")
        processed = process_talker_logits(raw, seen, num_generated, penalty, min_new_tokens, suppress, CODEC_EOS_ID)
        want = reference(processed, do_sample, temperature, top_k, top_p, keys, frame, 0, False)
        got = select_tokens(raw, do_sample, temperature, top_k, top_p, keys, frame, 0, False,
                            talker=(seen, penalty, num_generated, min_new_tokens, suppress, CODEC_EOS_ID))
        assert torch.equal(got, want), (step, (got != want).nonzero().flatten().tolist())
        # the same rows read in place from a whole table (seen_rows, as the decode step passes them)
        slots = torch.randperm(batch + 3, generator=g)[:batch].cuda()
        table = torch.zeros(batch + 3, 3072, dtype=torch.bool, device="cuda")
        table[slots] = seen
        in_place = select_tokens(raw, do_sample, temperature, top_k, top_p, keys, frame, 0, False,
                                 talker=(table, penalty, num_generated, min_new_tokens, suppress, CODEC_EOS_ID, slots))
        assert torch.equal(in_place, want)


@pytest.mark.parametrize("use_top_p", [False, True])
def test_row_scale_is_scale_rows_first_on_cuda(use_top_p):
    """row_scale=(x, eps) on the GPU (the code predictor's folded head, 64 rows of 1024): the same ids as the kernel
    on the logits folded_norms.scale_rows made, bf16."""
    from voxflow.kernels.select_tokens import select_tokens
    from voxflow.layers.folded_norms import scale_rows
    g = torch.Generator().manual_seed(21)
    logits, *rest = make_case(g, 64, 2048, torch.bfloat16, use_top_p, device="cuda")
    x = (torch.randn(64, 1024, generator=g) * torch.rand(64, 1, generator=g) * 4).to("cuda", torch.bfloat16)
    got = select_tokens(logits, *rest, 6, use_top_p, row_scale=(x, 1e-6))
    assert torch.equal(got, select_tokens(scale_rows(logits, x, 1e-6), *rest, 6, use_top_p))
