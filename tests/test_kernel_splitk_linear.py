"""splitk_linear (residual + x @ W^T, split-K reduced by the last program) on the CPU through Triton's interpreter (in
a subprocess: TRITON_INTERPRET must be set before triton is first imported).

Tolerances against a float64 reference: fp32 <= 1e-5 of the output scale (summation order only); bf16 / fp16 one
rounding of the fp32 result, so within an ulp of the reference's rounded value (<= 2^-7 / 2^-10 relative, plus
the fp32 sums' order)."""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_SPLITK_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
# Small tiles so that the shapes below span several N tiles, K splits and (past 16 rows) M tiles.
CONFIGS = (dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT=4), dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=3),
           dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, SPLIT=1))


def reference(x, w, residual):
    return residual.double() + x.double() @ w.double().t()


def counters_all_zero() -> bool:
    """Every tile counter this process has made (attention_o_proj.tile_counters, which splitk_linear uses) is 0."""
    from voxflow.kernels.attention_o_proj import _COUNTERS
    return bool(_COUNTERS) and all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


def check_against_float64():
    """Every config, M = 1 / 5 / 37 (past one M tile), N = 80 (a partial N tile), K = 96 (the 3-way split's slices
    end past K), with and without a residual: fp32 within 1e-5 of the scale, half dtypes within one rounding; the
    counters are back at zero."""
    from voxflow.kernels import splitk_linear as sl
    g = torch.Generator().manual_seed(0)
    for dtype, rel in ((torch.float32, 1e-5), (torch.bfloat16, 2.0 ** -7), (torch.float16, 2.0 ** -10)):
        for m in (1, 5, 37):
            x = torch.randn(m, 96, generator=g).to(dtype)
            w = (torch.randn(80, 96, generator=g) * 96 ** -0.5).to(dtype)
            r = torch.randn(m, 80, generator=g).to(dtype)
            want = reference(x, w, r)
            scale = want.abs().max().item()
            for cfg in CONFIGS:
                assert sl.supported(x, w, r)
                got = sl.splitk_linear(x, w, r, config=cfg)
                assert got.dtype == dtype and got.shape == (m, 80)
                err = (got.double() - want).abs()
                assert (err <= rel * (want.abs() + 1e-3 * scale) + 1e-6 * scale).all(), (dtype, m, cfg,
                                                                                        err.max().item())
                assert counters_all_zero(), "a tile counter was left set"
                # no residual: x @ W^T alone (the residual's load compiled out)
                plain = x.double() @ w.double().t()
                got = sl.splitk_linear(x, w, config=cfg)
                err = (got.double() - plain).abs()
                assert (err <= rel * (plain.abs() + 1e-3 * scale) + 1e-6 * scale).all(), (dtype, m, cfg, "plain")
                assert counters_all_zero(), "a tile counter was left set"


def check_in_place_and_deterministic():
    """out = residual (the in-place residual stream): the same bits as a separate output; two calls give the same
    bits (the splits are summed in order, whichever program finishes last); strided rows (a view of wider rows)."""
    from voxflow.kernels.splitk_linear import splitk_linear
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    r = torch.randn(9, 48, generator=g).to(torch.bfloat16)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=4)
    separate = splitk_linear(x, w, r, config=cfg)
    assert torch.equal(splitk_linear(x, w, r, config=cfg), separate)
    stream = r.clone()
    assert splitk_linear(x, w, stream, out=stream, config=cfg) is stream
    assert torch.equal(stream, separate)
    wide = torch.randn(9, 128, generator=g).to(torch.bfloat16)
    view = wide[:, 32:96]                                   # rows of stride 128, unit column stride
    assert torch.equal(splitk_linear(view, w, r, config=cfg), splitk_linear(view.contiguous(), w, r, config=cfg))


def check_launch_config_fills_the_gpu():
    """launch_config at the decode shapes: about 128 programs (N tiles x splits x M tiles), each K slice >= 256."""
    from voxflow.kernels.splitk_linear import launch_config
    for m, n, k in ((64, 1024, 2048), (64, 1024, 3072), (128, 1024, 3072), (16, 2048, 6144)):
        cfg = launch_config(m, n, k)
        programs = -(-n // cfg["BLOCK_N"]) * cfg["SPLIT"] * -(-m // cfg["BLOCK_M"])
        assert 64 < programs <= 128 and k // cfg["SPLIT"] >= 256, (m, n, k, cfg, programs)


def check_layer_switch():
    """qwen3_layer._residual_linear with SPLITK_RESIDUAL (kernels on): the kernel ran (spied), in place into the
    residual when asked, else into a new tensor, within one rounding of the addmm it replaces; off: addmm."""
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import splitk_linear as sl
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    r = torch.randn(12, 32, generator=g).to(torch.bfloat16)
    want = torch.addmm(r.float(), x.float(), w.float().t())
    saved = layer_mod.SPLITK_RESIDUAL, layer_mod.use_kernels, sl.splitk_linear
    calls = []
    sl.splitk_linear = lambda *a, **kw: (calls.append(1), saved[2](*a, **kw))[1]
    layer_mod.use_kernels = lambda t: True
    try:
        for on in (True, False):
            layer_mod.SPLITK_RESIDUAL = on
            calls.clear()
            fresh = layer_mod._residual_linear(x, w, r, in_place=False)
            stream = r.clone()
            inplace = layer_mod._residual_linear(x, w, stream, in_place=True)
            assert len(calls) == (2 if on else 0), (on, calls)
            assert inplace is stream and fresh is not r and torch.equal(fresh, inplace), on
            assert ((fresh.float() - want).abs() <= 2.0 ** -7 * want.abs() + 1e-2).all(), on
    finally:
        layer_mod.SPLITK_RESIDUAL, layer_mod.use_kernels, sl.splitk_linear = saved


def check_projection_switch():
    """qwen3_layer._projection with SPLITK_PROJECTIONS (kernels on): the kernel ran (spied) without a residual,
    within one rounding of F.linear; off: F.linear's bits, no kernel."""
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import splitk_linear as sl
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(96, 64, generator=g).to(torch.bfloat16)
    want = x.float() @ w.float().t()
    saved = layer_mod.SPLITK_PROJECTIONS, layer_mod.use_kernels, sl.splitk_linear
    calls = []
    sl.splitk_linear = lambda *a, **kw: (calls.append(len(a) + len(kw)), saved[2](*a, **kw))[1]
    layer_mod.use_kernels = lambda t: True
    try:
        for on in (True, False):
            layer_mod.SPLITK_PROJECTIONS = on
            calls.clear()
            got = layer_mod._projection(x, w)
            assert calls == ([2] if on else []), (on, calls)       # x and w only: no residual
            assert ((got.float() - want).abs() <= 2.0 ** -7 * want.abs() + 1e-2).all(), on
            if not on:
                assert torch.equal(got, torch.nn.functional.linear(x, w))
    finally:
        layer_mod.SPLITK_PROJECTIONS, layer_mod.use_kernels, sl.splitk_linear = saved


if IN_CHILD:
    def test_child_projection_switch():
        check_projection_switch()

    def test_child_against_float64():
        check_against_float64()

    def test_child_layer_switch():
        check_layer_switch()

    def test_child_in_place_and_deterministic():
        check_in_place_and_deterministic()

    def test_child_launch_config():
        check_launch_config_fills_the_gpu()
else:
    def test_splitk_linear_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)


def test_supported_refuses_what_the_kernel_cannot_take():
    """More than MAX_M rows, K not a multiple of 16, mixed dtypes, a transposed weight, a residual of the wrong
    shape or with overlapping rows: not supported, and splitk_linear raises before any launch; so does an output of
    the wrong shape, dtype or layout."""
    from voxflow.kernels.splitk_linear import MAX_M, splitk_linear, supported
    x, w, r = torch.zeros(4, 32), torch.zeros(8, 32), torch.zeros(4, 8)
    assert supported(x, w, r)
    bad = [(torch.zeros(MAX_M + 1, 32), w, torch.zeros(MAX_M + 1, 8)), (torch.zeros(4, 24), torch.zeros(8, 24), r),
           (x.bfloat16(), w, r), (x, torch.zeros(32, 8).t(), r), (x, w, torch.zeros(4, 9)),
           (x, w, torch.zeros(1, 8).expand(4, 8))]                  # rows that overlap (written in place)
    for args in bad:
        assert not supported(*args)
        with pytest.raises(ValueError, match="unsupported"):
            splitk_linear(*args)
    assert supported(x, w)                                          # no residual
    for out in (torch.zeros(4, 9), torch.zeros(4, 8, dtype=torch.float64), torch.zeros(8, 4).t()):
        with pytest.raises(ValueError, match="cannot hold"):        # an output it cannot write: refused
            splitk_linear(x, w, out=out)

