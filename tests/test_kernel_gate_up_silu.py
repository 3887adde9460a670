"""gate|up with the folded norm's row factor and silu * up in its epilogue (voxflow/kernels/gate_up_silu.py) against
the two launches it replaces (F.linear, then folded_norms.silu_mul_folded_reference), on the CPU under Triton's
interpreter (in a subprocess: tests/interpreter_child.py says why).

Tolerances:
- fp32: max |got - ref| <= 1e-5 * max |ref|: only the order of the fp32 sums differs (the GEMM's and the row's sum of
  squares).
- bf16 / fp16 with integer-valued inputs (small integers times powers of two): every GEMM sum and sum of squares is
  exact in fp32 whatever its order, so the kernel's rounding points are checked on their own: within 1 ulp (the
  interpreter's exp is numpy's, torch's CPU silu has its own formula: silu_mul's tests allow 1 ulp there too) and
  >= 99% bit-equal. A misplaced rounding point (e.g. scaling the unrounded GEMM sums by r) differs in far more.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from float_compare import assert_within_ulp, ulp_distance  # tests/float_compare.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_GATE_UP_SILU_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
EPS = 1e-6
# (rows, K, I): one row, padded 16-row and 64-row tiles, a last column block BLOCK_N does not fill (I = 48), a K the
# default BLOCK_K (128) does not divide (192: BLOCK_K 64)
CASES = ((1, 128, 64), (9, 192, 48), (33, 128, 96), (64, 256, 64))


def reference(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from voxflow.layers.folded_norms import silu_mul_folded_reference
    gate_up = F.linear(h, w)
    inter = w.shape[0] // 2
    return silu_mul_folded_reference(gate_up[:, :inter], gate_up[:, inter:], h, EPS)


def integer_inputs(m: int, k: int, inter: int, dtype: torch.dtype, gen: torch.Generator):
    """h, w of small integers times powers of two: fp32 sums exact in any order; rows of different scales."""
    h = torch.randint(-8, 9, (m, k), generator=gen).float() * torch.linspace(0.25, 2, m)[:, None].log2().round().exp2()
    w = torch.randint(-4, 5, (2 * inter, k), generator=gen).float() / 64
    return h.to(dtype), w.to(dtype)


if IN_CHILD:
    @pytest.mark.parametrize("case", CASES)
    def test_child_fp32(case):
        from voxflow.kernels.gate_up_silu import gate_up_silu
        m, k, inter = case
        gen = torch.Generator().manual_seed(m * 7 + k)
        h = torch.randn(m, k, generator=gen) * torch.linspace(0.5, 3, m)[:, None]
        w = torch.randn(2 * inter, k, generator=gen) * k ** -0.5 * 2
        got, ref = gate_up_silu(h, w, EPS), reference(h, w)
        assert got.shape == (m, inter)
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()

    @pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
    @pytest.mark.parametrize("case", CASES)
    def test_child_16bit_rounding_points(case, dtype):
        from voxflow.kernels.gate_up_silu import gate_up_silu
        m, k, inter = case
        h, w = integer_inputs(m, k, inter, dtype, torch.Generator().manual_seed(m + k))
        got, ref = gate_up_silu(h, w, EPS), reference(h, w)
        assert_within_ulp(got, ref, 1)
        assert (ulp_distance(got, ref) == 0).float().mean() >= 0.99
        # the row factor matters: the plain silu * up of the unscaled projection is something else
        plain = F.linear(h, w)
        assert not torch.allclose(got.float(), (F.silu(plain[:, :inter]) * plain[:, inter:]).float(), rtol=1e-2)

    def test_child_config_override_same_values():
        """Other tiles (more columns a program, BLOCK_K 64, fewer stages) give the same bits: the sums are exact."""
        from voxflow.kernels.gate_up_silu import gate_up_silu
        h, w = integer_inputs(64, 256, 64, torch.bfloat16, torch.Generator().manual_seed(3))
        base = gate_up_silu(h, w, EPS)
        other = gate_up_silu(h, w, EPS, config=dict(BLOCK_N=64, BLOCK_K=64, num_stages=2))
        assert torch.equal(base, other)
else:
    def test_gate_up_silu_under_the_interpreter_matches_torch():
        run_child(__file__, CHILD_FLAG)


def test_supported_and_rejections():
    from voxflow.kernels import gate_up_silu as gus
    h, w = torch.zeros(64, 1024, dtype=torch.bfloat16), torch.zeros(6144, 1024, dtype=torch.bfloat16)
    assert gus.supported(h, w)                                    # the code predictor's (and 0.6B talker's) shape
    assert gus.supported(torch.zeros(3, 2048), torch.zeros(12288, 2048))
    assert not gus.supported(torch.zeros(65, 1024, dtype=torch.bfloat16), w)          # more rows than MAX_M
    assert not gus.supported(h, w[:-1])                                              # odd 2 I
    assert not gus.supported(h[:, :1000], w[:, :1000].contiguous())                  # K not a multiple of 64
    assert not gus.supported(h.float(), w)                                           # mixed dtypes
    assert not gus.supported(torch.zeros(1024, 64, dtype=torch.bfloat16).t(), w)     # h not unit-stride
    with pytest.raises(ValueError, match="rows"):
        gus.gate_up_silu(torch.zeros(65, 1024, dtype=torch.bfloat16), w, EPS)


def test_launch_config_tiles_every_supported_shape():
    from voxflow.kernels.gate_up_silu import launch_config
    for m in (1, 5, 16, 17, 64):
        for k in (64, 192, 1024, 2048, 3072):
            cfg = launch_config(m, 3072, k)
            assert k % cfg["BLOCK_K"] == 0 and cfg["BLOCK_M"] >= max(m, 16)
