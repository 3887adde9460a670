"""The skinny decode GEMM with fused prologue/epilogue (voxflow/kernels/skinny_linear.py) against the unfused torch
expression, on the CPU under Triton's interpreter (in a subprocess: TRITON_INTERPRET must be set before triton is
first imported; see tests/interpreter_child.py).

Reference: the torch code the kernel replaces, in the same dtype, with the spec's rounding points: a = x |
rms_norm(x, nw) (voxflow/layers/rms_norm.py's expression) | silu(gate) * up; y = F.linear(a, w, bias) (the bias
added before the one rounding, as the GEMM epilogue does); y = residual + y. Tolerances:
- fp32: max |got - ref| <= 1e-5 * max |ref| per case. Only the fp32 summation order differs (the GEMM's and the
  norm's sum of squares); observed ~1e-7 relative.
- bf16, against an fp32 reference built from the same-dtype GEMM input a (so it measures the kernel's GEMM and
  epilogue roundings, not the prologue's): |got - ref32| <= 2^-7 * (|a| @ |w|^T + |bias| + |residual|). Each of
  the <= 2 roundings (y + bias, + residual) is within 2^-9 of a value bounded by that sum, and the margin also
  covers the rare 1-ulp difference of a norm-prologue element (its sum of squares is summed in another order).
- bf16, against the same-dtype reference: NOT bit-exact in general. torch's fp32 accumulation order differs from
  the kernel's, so the pre-rounding value can straddle a bf16 rounding boundary (1 ulp of y), and a residual or
  bias add that cancels turns that ulp of y into many ulps of the result. So: plain GEMMs within 1 ulp
  (assert_within_ulp), and every case >= 90% bit-equal (observed ~99%). The latter is what catches a misplaced
  rounding point (e.g. rounding y before adding the bias would differ in a large fraction of elements).
"""
from __future__ import annotations

import os

import pytest
import torch

from skinny_reference import EPS, reference  # tests/skinny_reference.py
from float_compare import assert_within_ulp, ulp_distance  # tests/float_compare.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_SKINNY_LINEAR_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
SHAPES = ((64, 128), (96, 64), (128, 256))          # (N, K)
ROWS = (1, 3, 33, 64)      # one row (FMA, its own tiles), FMA at 3, tl.dot padded (33) and full (64) tiles
VARIANTS = ("plain", "bias", "residual", "norm", "norm+residual", "gated", "gated+residual", "out=residual+bias")


def make_inputs(variant: str, m: int, n: int, k: int, dtype: torch.dtype, g: torch.Generator) -> dict:
    """Random inputs for one variant: y ~ O(1), a residual stream a few times larger."""
    gated = variant.startswith("gated")
    x = torch.randn(m, 2 * k if gated else k, generator=g)
    if gated:
        x[:, :k] *= 3                                   # gates across silu's curved range
    args = dict(x=x.to(dtype), w=(torch.randn(n, k, generator=g) * k ** -0.5).to(dtype), gated=gated)
    if "bias" in variant:
        args["bias"] = torch.randn(n, generator=g).to(dtype)
    if "residual" in variant:
        # a row-strided view, as a slice of a wider buffer would be
        args["residual"] = (torch.randn(m, n + 8, generator=g) * 4).to(dtype)[:, :n]
    if variant.startswith("norm"):
        args["norm_weight"] = (torch.randn(k, generator=g) * 0.5 + 1).to(dtype)
    return args


def run_variant(variant: str, args: dict, config: dict | None = None) -> torch.Tensor:
    from voxflow.kernels.skinny_linear import skinny_linear, supported
    assert supported(args["x"], args["w"], gated=args["gated"])
    if variant.startswith("out="):
        res = args["residual"]
        got = skinny_linear(**args, eps=EPS, out=res, config=config)
        assert got is res                                 # written in place into the residual stream
        return got
    return skinny_linear(**args, eps=EPS, config=config)


def check(variant: str, args: dict, got: torch.Tensor, want: tuple, label) -> float:
    """Asserts the tolerances of the module docstring; returns the bit-equal fraction."""
    y, y32, scale = want
    m, n = args["x"].shape[0], args["w"].shape[0]
    assert got.shape == (m, n) and got.dtype == args["x"].dtype, (label, got.shape, got.dtype)
    if got.dtype == torch.float32:
        err = (got - y).abs().max().item()
        assert err <= 1e-5 * y.abs().max().item(), (label, err)
        return 1.0
    err32 = (got.float() - y32).abs()
    assert (err32 <= 2.0 ** -7 * scale).all(), (label, (err32 / scale).max().item())
    if variant == "plain":
        assert_within_ulp(got, y, 1)
    exact = (ulp_distance(got, y) == 0).float().mean().item()
    assert exact >= 0.9, (label, exact)
    return exact


def check_variants(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        for m in ROWS:
            for variant in VARIANTS:
                args = make_inputs(variant, m, n, k, dtype, g)
                want = reference(**args)                  # before the in-place variant overwrites the residual
                check(variant, args, run_variant(variant, args), want, (dtype, n, k, m, variant))


# Config overrides: the other GEMM path at each M (dot at tiny M, register FMAs at large M), small tiles that
# loop over K several times, and the deterministic split-K (with every prologue/epilogue it must carry over), its
# partials summed by the last program of each column block (the fixup, the default) or by the reduce kernel.
OVERRIDES = (
    (3, "bias", dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)),
    (33, "norm+residual", dict(USE_DOT=False, BLOCK_M=64, BLOCK_N=8, BLOCK_K=16)),
    (1, "norm", dict(BLOCK_K=16, BLOCK_N=32)),
    (5, "gated+residual", dict(SPLIT_K=2)),
    (16, "out=residual+bias", dict(SPLIT_K=4)),
    (64, "norm", dict(SPLIT_K=2, BLOCK_K=32)),
    (5, "gated+residual", dict(SPLIT_K=2, FIXUP=False)),
    (16, "out=residual+bias", dict(SPLIT_K=4, FIXUP=False)),
)


def check_config_overrides(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    n, k = 96, 128
    for m, variant, config in OVERRIDES:
        args = make_inputs(variant, m, n, k, dtype, g)
        keep = {key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()}
        want = reference(**args)
        got = run_variant(variant, args, config)
        check(variant, args, got, want, (dtype, m, variant, config))
        again = run_variant(variant, keep, config)        # deterministic: the same bits on a second run
        assert torch.equal(got, again), (dtype, m, variant, config)


def check_split_k_fixup(dtype: torch.dtype) -> None:
    """The split-K fixup (the last program of a column block sums the partials and runs the epilogue) gives the
    reduce kernel's bits, with every prologue / epilogue, a partial last column block and 2-4 splits; each block's
    arrival count is back at zero after every call (a count left behind would leave the next call's block unsummed,
    which the repeated calls would show)."""
    from voxflow.kernels import skinny_linear as sk
    g = torch.Generator().manual_seed(3)
    for m, variant, split in ((64, "norm+residual", 2), (9, "gated+residual", 4), (33, "out=residual+bias", 3)):
        n, k = 72, 96 * split                                   # (72: the last 16-column block is half full)
        args = make_inputs(variant, m, n, k, dtype, g)

        def fresh():            # the same weight (its counts) each call; a residual of its own (out= writes it)
            return dict(args, residual=args["residual"].clone()) if args.get("residual") is not None else args
        want = run_variant(variant, fresh(), dict(SPLIT_K=split, BLOCK_N=16, FIXUP=False))
        for _ in range(2):
            assert torch.equal(run_variant(variant, fresh(), dict(SPLIT_K=split, BLOCK_N=16)), want), (m, variant)
            counts = sk._ARRIVAL_COUNTS[(args["w"].device, args["w"].data_ptr(), 5)]
            assert counts.shape == (5,) and not counts.any(), counts


def check_weight_preload(dtype: torch.dtype) -> None:
    """pdl.py's weight preload (the first K step's W tile loaded before the PDL wait, its step peeled off the loop)
    gives the loop's bits, one K step or several, with every prologue / epilogue."""
    from voxflow.kernels.skinny_linear import skinny_linear
    g = torch.Generator().manual_seed(2)
    for variant in ("plain", "norm", "gated+residual", "out=residual+bias"):
        for config in (dict(BLOCK_K=32, BLOCK_N=16), dict(BLOCK_K=128, BLOCK_N=8)):   # 4 K steps / 1 step
            args = make_inputs(variant, 1, 72, 128, dtype, g)
            plain = skinny_linear(**args, eps=EPS, config=config, preload=False)
            got = skinny_linear(**args, eps=EPS, config=config, preload=True)
            assert torch.equal(got, plain), (dtype, variant, config)


if IN_CHILD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("check", (check_variants, check_weight_preload, check_config_overrides,
                                       check_split_k_fixup), ids=lambda f: f.__name__)
    def test_child(check, dtype):
        check(dtype)
else:
    def test_skinny_linear_under_the_interpreter_matches_torch():
        run_child(__file__, CHILD_FLAG)


# Validation runs before any launch: these need no interpreter (and run in both processes).

def test_supported_accepts_the_real_shapes():
    from voxflow.kernels.skinny_linear import supported
    for k, n in ((1024, 4096), (2048, 1024), (2048, 12288), (2048, 3072)):
        assert supported(torch.zeros(64, k, dtype=torch.bfloat16), torch.zeros(n, k, dtype=torch.bfloat16))
    for k, n in ((3072, 1024), (6144, 2048)):                    # down_proj reading a gate|up output
        x = torch.zeros(2, 2 * k)
        assert supported(x, torch.zeros(n, k), gated=True) and not supported(x, torch.zeros(n, k))
    assert supported(torch.zeros(3, 200)[:, 8:136], torch.zeros(32, 128))       # a row-strided view


def test_supported_rejections():
    from voxflow.kernels.skinny_linear import MAX_M, supported
    w = torch.zeros(32, 64)
    rejected = {
        "3-D x": (torch.zeros(1, 2, 64), w),
        "no rows": (torch.zeros(0, 64), w),
        "too many rows": (torch.zeros(MAX_M + 1, 64), w),
        "K mismatch": (torch.zeros(2, 48), w),
        "K % 16": (torch.zeros(2, 40), torch.zeros(32, 40)),
        "dtype mismatch": (torch.zeros(2, 64, dtype=torch.bfloat16), w),
        "float64": (torch.zeros(2, 64, dtype=torch.float64), w.double()),
        "column-strided x": (torch.zeros(64, 2).t(), w),
        "non-contiguous w": (torch.zeros(2, 64), torch.zeros(64, 32).t()),
        "meta device": (torch.zeros(2, 64, device="meta"), torch.zeros(32, 64, device="meta")),
    }
    for why, (x, wt) in rejected.items():
        assert not supported(x, wt), why
    assert not supported(torch.zeros(2, 64), w, gated=True)                        # needs 2K columns
    with torch.enable_grad():
        assert not supported(torch.zeros(2, 64, requires_grad=True), w)


def test_the_wrappers_hand_the_preload_decision_to_the_kernels(monkeypatch):
    """pdl.weight_preload's decision (PDL on, the switch, N and K >= the width, one row; skinny_linear: the
    one-split FMA path) reaches the kernels' PRELOAD: both kernels stubbed, PDL forced on, no launch."""
    from voxflow.kernels import norm_linear as nl
    from voxflow.kernels import pdl
    from voxflow.kernels import skinny_linear as sk
    seen = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw.get("PRELOAD"))
    for module, name in ((nl, "_norm_linear_kernel"), (sk, "_skinny_linear_kernel"), (sk, "_split_k_reduce_kernel")):
        monkeypatch.setattr(module, name, Stub())
    for module in (nl, sk):
        monkeypatch.setattr(module, "use_pdl", lambda t: True)
    monkeypatch.setattr(pdl, "_preload", True)
    monkeypatch.setattr(pdl, "PRELOAD_MIN_WIDTH", 2048)

    def decided(call) -> bool:
        seen.clear()
        call()
        return seen[0]

    def talker_qkv(m: int):
        return nl.norm_linear(torch.randn(m, 2048), torch.randn(4096, 2048), torch.ones(2048), 1e-6)
    assert decided(lambda: talker_qkv(1))
    assert not decided(lambda: talker_qkv(2))                                                  # more than one row
    assert not decided(lambda: nl.norm_linear(torch.randn(1, 1024), torch.randn(4096, 1024), torch.ones(1024),
                                              1e-6))                                           # the predictor's width
    assert decided(lambda: sk.skinny_linear(torch.randn(1, 6144), torch.randn(2048, 6144)))   # talker down_proj
    assert not decided(lambda: sk.skinny_linear(torch.randn(1, 3072), torch.randn(1024, 3072)))
    assert not decided(lambda: sk.skinny_linear(torch.randn(1, 6144), torch.randn(2048, 6144),
                                                config=dict(SPLIT_K=2)))
    monkeypatch.setattr(pdl, "_preload", False)
    assert not decided(lambda: talker_qkv(1))


def test_weight_preload_is_refused_off_the_one_split_fma_path():
    from voxflow.kernels.skinny_linear import skinny_linear
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    for config in (dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), dict(SPLIT_K=2)):
        with pytest.raises(ValueError, match="preload"):
            skinny_linear(x, w, config=config, preload=True)


def test_bad_inputs_raise_clear_errors():
    from voxflow.kernels.skinny_linear import skinny_linear
    x, w = torch.zeros(4, 64), torch.zeros(32, 64)
    square = torch.zeros(4, 64)
    cases = [
        (dict(x=torch.zeros(4, 48), w=w), "columns"),
        (dict(x=torch.zeros(65, 64), w=w), "rows"),
        (dict(x=torch.zeros(4, 128), w=w, gated=True, norm_weight=torch.ones(64)), "mutually exclusive"),
        (dict(x=x, w=w, bias=torch.zeros(31)), "bias"),
        (dict(x=x, w=w, bias=torch.zeros(32, dtype=torch.bfloat16)), "bias"),
        (dict(x=x, w=w, norm_weight=torch.ones(32)), "norm_weight"),
        (dict(x=x, w=w, residual=torch.zeros(4, 31)), "residual"),
        (dict(x=x, w=w, residual=torch.zeros(32, 4).t()), "residual"),
        (dict(x=x, w=w, out=torch.zeros(4, 32, dtype=torch.bfloat16)), "out"),
        (dict(x=square, w=torch.zeros(64, 64), out=square), "share memory"),        # out over x itself
        (dict(x=x, w=w, config=dict(BLOCK_Q=4)), "unknown config"),
        (dict(x=x, w=w, config=dict(BLOCK_M=2)), "does not fit"),
        (dict(x=x, w=w, config=dict(SPLIT_K=3)), "does not fit"),
        (dict(x=x, w=w, config=dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=8)), "does not fit"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            skinny_linear(**kwargs)


def test_launch_config_splits_k_only_below_the_switchs_block_count(monkeypatch):
    """SPLIT_K_BELOW_BLOCKS (VOXFLOW_SKINNY_SPLIT_K_BELOW): tensor-core launches with fewer column blocks than the
    switch's count split K in two where each half is whole tiles; register-FMA launches (M <= 4) and wide N never;
    at 0 nothing splits. "auto" (the default) splits where the doubled programs still fit the device's SMs in one
    wave (2 x blocks <= SMs: the 64 blocks of N = 1024 on a 132-SM H100 / H200, not on a 114-SM H100 PCIe) and
    nowhere when the SM count is unknown (the interpreter's CPU tensors)."""
    from voxflow.kernels import skinny_linear as sk
    bf16 = torch.bfloat16
    shapes = ((64, 1024, 2048), (64, 1024, 3072), (16, 1024, 2048), (64, 4096, 1024), (4, 1024, 2048),
              (64, 1024, 128 + 16))

    def splits(sms=None):
        return [sk.launch_config(m, n, k, bf16, sms)["SPLIT_K"] for m, n, k in shapes]

    assert sk.SPLIT_K_BELOW_BLOCKS == "auto" or "VOXFLOW_SKINNY_SPLIT_K_BELOW" in os.environ
    monkeypatch.setattr(sk, "SPLIT_K_BELOW_BLOCKS", 0)
    assert splits(132) == [1] * 6
    monkeypatch.setattr(sk, "SPLIT_K_BELOW_BLOCKS", 96)
    assert splits() == splits(132) == [2, 2, 2, 1, 1, 1]
    monkeypatch.setattr(sk, "SPLIT_K_BELOW_BLOCKS", "auto")
    assert splits(132) == splits(128) == [2, 2, 2, 1, 1, 1]
    assert splits(127) == splits(114) == splits() == [1] * 6
    assert sk.split_k_below(132) == 67 and sk.split_k_below(None) == 0
