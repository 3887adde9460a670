"""The tensor-core decode GEMMs with their epilogues (voxflow/kernels/batch_linear.py: + residual, silu * up)
against the plain torch code, on the CPU under Triton's interpreter (in a subprocess, see
tests/interpreter_child.py). Reference: tests/skinny_reference.py (the unfused expression in the same dtype, its
fp32 version and an error scale).

Tolerances (the epilogues round where the reference does: round(y), then residual + it, rounded; silu(gate) * up
from the rounded gate and up, silu rounded, the product rounded): fp32 <= 1e-5 * max |ref| (summation order);
bf16 |got - y32| <= 2^-7 * scale (a few roundings of the propagated scale) and >= 90% bit-equal to the same-dtype
torch result [interpreter: ~100%].
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from float_compare import ulp_distance  # tests/float_compare.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py
from skinny_reference import reference  # tests/skinny_reference.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_BATCH_LINEAR_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def inputs(m, n, k, dtype, swiglu, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 2).to(dtype)
    w = (torch.randn(2 * n if swiglu else n, k, generator=g) * k ** -0.5).to(dtype)
    res = (torch.randn(m, n, generator=g) * 4).to(dtype)
    return x, w, res


def check(dtype, m, n, k, mode, config, seed=0):
    """mode: "residual" (out written over the residual) or "swiglu"."""
    from voxflow.kernels.batch_linear import batch_linear
    x, w, res = inputs(m, n, k, dtype, mode == "swiglu", seed)
    if mode == "residual":
        y, y32, scale = reference(x, w, residual=res.clone())
        got = batch_linear(x, w, residual=res, out=res, config=config)
        assert got.data_ptr() == res.data_ptr()
    else:
        # the layer's unfused expression: the gate|up GEMM, then silu(gate) * up on its two halves (same dtype)
        gate_up, gate_up32, scale_gu = reference(x, w)
        y = F.silu(gate_up[:, :n]) * gate_up[:, n:]
        g32, u32 = gate_up32[:, :n], gate_up32[:, n:]
        y32 = F.silu(g32) * u32
        # |d(silu(g) u)| <= 1.1 |dg| |u| + |silu(g)| |du|, plus the output's own rounding
        scale = 1.1 * scale_gu[:, :n] * u32.abs() + F.silu(g32).abs() * scale_gu[:, n:] + y32.abs()
        got = batch_linear(x, w, swiglu=True, config=config)
    label = (dtype, m, n, k, mode, config)
    assert got.shape == (m, n) and got.dtype == dtype, label
    if dtype == torch.float32:
        assert (got - y).abs().max().item() <= 1e-5 * y.abs().max().item(), label
        return
    assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), (label, ((got.float() - y32).abs() / scale).max())
    assert (ulp_distance(got, y) == 0).float().mean().item() >= 0.9, label


def check_cases(dtype):
    for mode in ("residual", "swiglu"):
        check(dtype, 20, 64, 128, mode, None)                                         # the GPU launch config
        # 20 rows in a masked 32-row tile; two row tiles of 16 with a K loop and a partial N tile
        check(dtype, 20, 72, 128, mode, dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32))
        check(dtype, 20, 72, 128, mode, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64))
        check(dtype, 3, 64, 256, mode, None)                                          # a few rows, K loop
    check(dtype, 80, 48, 64, "residual", None)                                        # > 64 rows: 2 row tiles


if IN_CHILD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_batch_linear(dtype):
        check_cases(dtype)
else:
    def test_batch_linear_under_the_interpreter_matches_torch():
        run_child(__file__, CHILD_FLAG)


# Validation runs before any launch: these need no interpreter (and run in both processes).

def test_supported_and_errors():
    from voxflow.kernels import batch_linear as bl
    bf = torch.bfloat16
    x = torch.zeros(64, 1024, dtype=bf)
    assert bl.supported(x, torch.zeros(4096, 1024, dtype=bf))
    assert bl.supported(x, torch.zeros(6144, 1024, dtype=bf), swiglu=True)
    assert bl.supported(x, torch.zeros(1024, 1024, dtype=bf), residual=torch.zeros(64, 1024, dtype=bf))
    assert not bl.supported(x, torch.zeros(4096, 1024))                                    # dtypes
    assert not bl.supported(x, torch.zeros(4096, 1000, dtype=bf))                          # K
    assert not bl.supported(x, torch.zeros(4095, 1024, dtype=bf), swiglu=True)             # odd 2N
    assert not bl.supported(x, torch.zeros(1024, 2048, dtype=bf).t())                      # W not contiguous
    assert not bl.supported(x, torch.zeros(1024, 1024, dtype=bf), residual=torch.zeros(64, 512, dtype=bf))
    assert not bl.supported(torch.zeros(64, 2048, dtype=bf)[:, ::2], torch.zeros(64, 1024, dtype=bf))  # x stride
    with pytest.raises(ValueError, match="unsupported"):
        bl.batch_linear(x, torch.zeros(4096, 1000, dtype=bf))
    with pytest.raises(ValueError, match="unknown config"):
        bl.batch_linear(x, torch.zeros(64, 1024, dtype=bf), config=dict(BLOCK_Q=4))
    with pytest.raises(ValueError, match="BLOCK_K"):
        bl.batch_linear(x, torch.zeros(64, 1024, dtype=bf), config=dict(BLOCK_K=48))
    with pytest.raises(ValueError, match="out"):
        bl.batch_linear(x, torch.zeros(64, 1024, dtype=bf), out=torch.zeros(64, 32, dtype=bf))
