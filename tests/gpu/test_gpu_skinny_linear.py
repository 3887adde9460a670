"""The skinny decode GEMM (voxflow/kernels/skinny_linear.py) on CUDA at the real layer shapes, M = 1..64 rows, each
with the prologue/epilogue the layer uses it with (and bare), against the unfused torch expression; also the
tuning overrides (dot at tiny M, split-K) and a CUDA-graph capture replayed on new inputs.

Tolerances as in tests/test_kernel_skinny_linear.py (its docstring says why): fp32 within 1e-5 of max |ref| (no
TF32 in the reference); bf16 within 2^-7 * (|a| @ |w|^T + |bias| + |residual|) of the fp32 result of the same
bf16 GEMM input, >= 90% bit-equal to the same-dtype torch result, plain GEMMs within 1 ulp of it. cuBLAS's bf16
reduced-precision split-K reduction is switched off for the reference (it would add roundings the spec lacks).
"""
import pytest
import torch

from skinny_reference import EPS, reference  # tests/skinny_reference.py
from float_compare import ulp_distance  # tests/float_compare.py

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

SHAPES = pytest.importorskip("voxflow.kernels.skinny_linear", reason="needs triton").QWEN3_TTS_SHAPES


@pytest.fixture(autouse=True)
def exact_references():
    """fp32 references without TF32, bf16 references without reduced-precision split-K sums."""
    m = torch.backends.cuda.matmul
    saved = m.allow_tf32, m.allow_bf16_reduced_precision_reduction
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = False, False
    yield
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = saved


def make_inputs(variant, m, n, k, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    gated = variant.startswith("gated")
    x = torch.randn(m, 2 * k if gated else k, device="cuda", generator=g)
    if gated:
        x[:, :k] *= 3
    args = dict(x=x.to(dtype), w=(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(dtype), gated=gated)
    if "bias" in variant:
        args["bias"] = torch.randn(n, device="cuda", generator=g).to(dtype)
    if "residual" in variant:
        args["residual"] = (torch.randn(m, n, device="cuda", generator=g) * 4).to(dtype)
    if variant.startswith("norm"):
        args["norm_weight"] = (torch.randn(k, device="cuda", generator=g) * 0.5 + 1).to(dtype)
    return args


def check(variant, got, want, label):
    y, y32, scale = want
    assert got.shape == y.shape and got.dtype == y.dtype, (label, got.shape, got.dtype)
    if got.dtype == torch.float32:
        err = (got - y).abs().max().item()
        assert err <= 1e-5 * y.abs().max().item(), (label, err)
        return
    err32 = (got.float() - y32).abs()
    assert (err32 <= 2.0 ** -7 * scale).all(), (label, (err32 / scale).max().item())
    if variant == "plain":
        # One rounding of the exact sum, up to fp32 accumulation error (~K * 2^-24 of the scale): no ulp count
        # against cuBLAS's own bf16 result, which near cancellation (|y| << scale) can differ by many ulps.
        assert (err32 <= y32.abs() * 2.0 ** -8 + 2.0 ** -16 * scale).all(), (label, (err32 / scale).max().item())
    exact = (ulp_distance(got, y) == 0).float().mean().item()
    assert exact >= 0.9, (label, exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 16, 64])
@pytest.mark.parametrize("name,k,n,fused", SHAPES, ids=[s[0] for s in SHAPES])
def test_skinny_linear_matches_torch_at_real_shapes(name, k, n, fused, m, dtype):
    from voxflow.kernels.skinny_linear import skinny_linear, supported
    for variant in ("plain", fused):
        args = make_inputs(variant, m, n, k, dtype)
        assert supported(args["x"], args["w"], gated=args["gated"])
        want = reference(**args)
        got = skinny_linear(**args, eps=EPS)
        check(variant, got, want, (name, m, dtype, variant))
        assert torch.equal(got, skinny_linear(**args, eps=EPS))          # deterministic


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_linear_config_overrides(dtype):
    """The tuning script's candidates must compile and be right too: dot at tiny M, FMAs at large M, split-K."""
    from voxflow.kernels.skinny_linear import skinny_linear
    cases = (
        (2, "norm", 1024, 4096, dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16)),
        (16, "gated+residual", 3072, 1024, dict(USE_DOT=False, BLOCK_M=16, BLOCK_N=8, BLOCK_K=64)),
        (16, "residual", 6144, 2048, dict(SPLIT_K=4)),
        (64, "norm", 2048, 1024, dict(SPLIT_K=2, BLOCK_N=64)),
        (1, "bias", 2048, 1024, dict(SPLIT_K=2)),
    )
    for m, variant, k, n, config in cases:
        args = make_inputs(variant, m, n, k, dtype, seed=1)
        want = reference(**args)
        got = skinny_linear(**args, eps=EPS, config=config)
        check(variant, got, want, (m, variant, config))
        assert torch.equal(got, skinny_linear(**args, eps=EPS, config=config))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_linear_split_k_fixup_equals_the_reduce_kernel(dtype):
    """The split-K fixup (the last program of each column block sums the partials, FIXUP) gives the reduce kernel's
    bits at the code predictor's N = 1024 shapes (SPLIT_K_BELOW_BLOCKS' cases) and a 4-way split: eagerly, and
    eight launches on one weight captured in a CUDA graph (PDL where it runs: each launch's programs start while
    the one before drains) and replayed 20 times, the outputs cleared before each replay (a block whose count went
    wrong would leave its columns unsummed). The arrival counts are zero after."""
    from voxflow.kernels import skinny_linear as sk
    for m, variant, k, n, split in ((64, "residual", 2048, 1024, 2), (64, "gated+residual", 3072, 1024, 2),
                                    (9, "norm", 1024, 2048, 4)):
        args = make_inputs(variant, m, n, k, dtype, seed=3)
        want = sk.skinny_linear(**args, eps=EPS, config=dict(SPLIT_K=split, FIXUP=False))
        check(variant, want, reference(**args), (m, variant, "reduce kernel"))
        assert torch.equal(sk.skinny_linear(**args, eps=EPS, config=dict(SPLIT_K=split)), want), (m, variant)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [sk.skinny_linear(**args, eps=EPS, config=dict(SPLIT_K=split)) for _ in range(8)]
        for _ in range(20):
            for out in outs:
                out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(out, want) for out in outs), (m, variant)
        counts = [c for key, c in sk._ARRIVAL_COUNTS.items() if key[1] == args["w"].data_ptr()]
        assert counts and not any(c.any() for c in counts)


def test_skinny_linear_in_place_residual():
    from voxflow.kernels.skinny_linear import skinny_linear
    args = make_inputs("gated+residual", 16, 2048, 6144, torch.bfloat16)
    want = reference(**args)
    res = args["residual"]
    assert skinny_linear(**args, eps=EPS, out=res) is res
    check("gated+residual", res, want, "in place")


def test_skinny_linear_in_a_cuda_graph():
    """A decoder layer's MLP half, captured: norm into gate|up, then silu*up + residual (in place) into down.
    Inputs are changed in place after capture; one replay must give the torch result for the new inputs."""
    from voxflow.kernels.skinny_linear import skinny_linear
    dtype, m, hidden, inter = torch.bfloat16, 4, 1024, 3072
    g = torch.Generator(device="cuda").manual_seed(2)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)
    rows, nw = rand(m, hidden, scale=4), rand(hidden) + 1
    gate_up_w, down_w = rand(2 * inter, hidden, scale=hidden ** -0.5), rand(hidden, inter, scale=inter ** -0.5)

    def step():
        gate_up = skinny_linear(rows, gate_up_w, norm_weight=nw, eps=EPS)
        return skinny_linear(gate_up, down_w, gated=True, residual=rows, out=rows)
    step()                                                # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    assert out.data_ptr() == rows.data_ptr()
    rows.copy_(rand(m, hidden, scale=4))
    nw.copy_(rand(hidden) + 1)
    down_w.copy_(rand(hidden, inter, scale=inter ** -0.5))
    before = rows.clone()
    gate_up_ref = reference(before, gate_up_w, norm_weight=nw)[0]
    want = reference(gate_up_ref, down_w, residual=before, gated=True)
    graph.replay()
    torch.cuda.synchronize()
    # gate_up may differ from the reference by an ulp here and there, which the down GEMM spreads: compare to the
    # fp32 result with the bf16-scale bound only.
    err32 = (rows.float() - want[1]).abs()
    assert (err32 <= 2.0 ** -7 * want[2]).all(), (err32 / want[2]).max().item()
    assert (ulp_distance(rows, want[0]) == 0).float().mean().item() >= 0.9
