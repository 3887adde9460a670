"""splitk_linear (residual + x @ W^T, split-K reduced by the last program) on CUDA at the 0.6B decode layers' o_proj
and down_proj shapes: against addmm, eager and replayed from a CUDA graph, and through the folded layer; without a
residual at the q|k|v and gate|up shapes."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

SHAPES = ((1024, 2048), (1024, 3072))       # (N, K): o_proj, down_proj (hidden 1024: the 0.6B talker and every CP)


@pytest.mark.parametrize("rows", [9, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_splitk_linear_matches_addmm(rows, dtype):
    """fp32 within 1e-5 of the fp32 product's scale (fp32 sums in another order); bf16 within one rounding of the
    fp32 product of the same bf16 inputs (2^-8 relative + 1e-2 absolute); in place equals out of place bit for bit,
    two calls agree bit for bit, and the tile counters are back at zero."""
    from voxflow.kernels import splitk_linear as sl
    from voxflow.kernels.attention_o_proj import _COUNTERS
    for n, k in SHAPES:
        x = torch.randn(rows, k, device="cuda").to(dtype)
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
        r = torch.randn(rows, n, device="cuda").to(dtype)
        want = torch.addmm(r.double(), x.double(), w.double().t())
        got = sl.splitk_linear(x, w, r)
        tol = 1e-5 * want.abs().max() if dtype == torch.float32 else want.abs() * 2.0 ** -8 + 1e-2
        assert ((got.double() - want).abs() <= tol).all(), (n, k, (got.double() - want).abs().max().item())
        assert torch.equal(sl.splitk_linear(x, w, r), got)
        stream = r.clone()
        assert torch.equal(sl.splitk_linear(x, w, stream, out=stream), got)
        torch.cuda.synchronize()
        assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


@pytest.mark.parametrize("split", [1, 2, 4])
def test_splitk_linear_without_residual_matches_mm(split):
    """x @ W^T alone at the K = 1024 projections (q|k|v N 4096, gate|up N 6144; 64 rows, bf16), one split (tiles
    stored straight) and more: within one rounding of the fp32 product, two calls agree bit for bit."""
    from voxflow.kernels import splitk_linear as sl
    for n in (4096, 6144):
        x = torch.randn(64, 1024, device="cuda").bfloat16()
        w = (torch.randn(n, 1024, device="cuda") * 1024 ** -0.5).bfloat16()
        want = x.double() @ w.double().t()
        got = sl.splitk_linear(x, w, config={"SPLIT": split})
        assert ((got.double() - want).abs() <= want.abs() * 2.0 ** -8 + 1e-2).all(), (n, split)
        assert torch.equal(sl.splitk_linear(x, w, config={"SPLIT": split}), got)


def test_splitk_linear_in_a_cuda_graph():
    """Captured after an eager call (the tile counters made): replays with new inputs give the eager call's bits, the
    residual stream updated in place each replay (the counters reset by each replay's last programs)."""
    from voxflow.kernels.splitk_linear import splitk_linear
    n, k = SHAPES[1]
    x = torch.randn(64, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16()
    r = torch.randn(64, n, device="cuda").bfloat16()
    stream = r.clone()
    splitk_linear(x, w, stream, out=stream)                  # eager: makes the counters (and compiles)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        splitk_linear(x, w, stream, out=stream)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        splitk_linear(x, w, stream, out=stream)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        stream.copy_(r)
        want = splitk_linear(x, w, r.clone())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(stream, want)


@torch.no_grad()
@pytest.mark.parametrize("switch", ["SPLITK_RESIDUAL", "SPLITK_PROJECTIONS"])
def test_folded_layer_with_splitk_close_to_cublas(switch):
    """qwen3_layer.SPLITK_RESIDUAL in the folded layers' o_proj / down_proj, SPLITK_PROJECTIONS in their q|k|v and
    gate|up (the 0.6B code predictor at 64 rows, bf16): the kernel ran twice a layer pass (spied), teacher-forced
    logits within 5e-2 of max |logit| of the cuBLAS path's, greedy codes equal up to near-ties."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import splitk_linear as sl
    from test_gpu_cp_layer import assert_codes_equal_up_to_near_ties, predict_on_vs_off
    saved = getattr(layer_mod, switch), sl.splitk_linear
    calls = []
    sl.splitk_linear = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    first = 1 if cp_mod.CP_JOINT_PREFILL else 2 * cp_mod.CP_SPLIT_PREFILL      # folded passes of the first step
    try:
        codes_on, codes_off, logits_off, err = predict_on_vs_off(
            lambda on: setattr(layer_mod, switch, on), calls, 64, torch.bfloat16, 5e-2,
            expected=2 * 5 * (14 + first), talker=1024)
        assert_codes_equal_up_to_near_ties(codes_on, codes_off, logits_off, err)
    finally:
        setattr(layer_mod, switch, saved[0])
        sl.splitk_linear = saved[1]
