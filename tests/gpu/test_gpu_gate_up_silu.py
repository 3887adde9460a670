"""gate_up_silu (voxflow/kernels/gate_up_silu.py) on the GPU against the two launches it replaces: cuBLAS's gate|up
GEMM (F.linear) and silu_mul_folded, at the real shapes (the code predictor's and the 0.6B talker's K = 1024,
I = 3072; the 1.7B talker's K = 2048, I = 6144).

Tolerances: fp32 max |got - ref| <= 1e-5 * max |ref| (the GEMM's fp32 summation order differs from cuBLAS's). bf16:
cuBLAS's order differs too, so a gate or up value can round to its bf16 neighbour before the row factor: within
2 ulp (one for the operand, one the product may carry) and >= 95% bit-equal; a misplaced rounding point differs in
far more (the interpreter tests, with exact sums, hold the rounding points themselves).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from float_compare import assert_within_ulp, ulp_distance  # tests/float_compare.py

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
DEV = "cuda"
EPS = 1e-6


def two_launches(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from voxflow.kernels.silu_mul import silu_mul_folded
    gate_up = F.linear(h, w)
    inter = w.shape[0] // 2
    return silu_mul_folded(gate_up[:, :inter], gate_up[:, inter:], h, EPS)


def inputs(m: int, k: int, inter: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    h = torch.randn(m, k, device=DEV, generator=gen) * torch.linspace(0.5, 4, m, device=DEV)[:, None]
    w = torch.randn(2 * inter, k, device=DEV, generator=gen) * k ** -0.5 * 3
    return h.to(dtype), w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 8, 33, 64])
@pytest.mark.parametrize("k,inter", [(1024, 3072), (2048, 6144)])
@torch.no_grad()
def test_matches_cublas_and_silu_mul_folded(k, inter, m, dtype):
    from voxflow.kernels.gate_up_silu import gate_up_silu
    h, w = inputs(m, k, inter, dtype, m + k)
    got, ref = gate_up_silu(h, w, EPS), two_launches(h, w)
    if dtype == torch.float32:
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()
    else:
        assert_within_ulp(got, ref, 2)
        assert (ulp_distance(got, ref) == 0).float().mean() >= 0.95


@pytest.mark.parametrize("tiles", [dict(BLOCK_N=16), dict(BLOCK_N=64, BLOCK_K=64), dict(num_stages=2, num_warps=8)])
@torch.no_grad()
def test_other_tiles_agree(tiles):
    """Other tiles (VOXFLOW_GATE_UP_SILU_TILES's A/B) split the sums differently across programs, warps and
    tensor-core instructions, so not necessarily to the bit: within 1 ulp, >= 99% bit-equal."""
    from voxflow.kernels.gate_up_silu import gate_up_silu
    h, w = inputs(64, 1024, 3072, torch.bfloat16, 5)
    got, base = gate_up_silu(h, w, EPS, config=tiles), gate_up_silu(h, w, EPS)
    assert_within_ulp(got, base, 1)
    assert (ulp_distance(got, base) == 0).float().mean() >= 0.99


@torch.no_grad()
def test_in_a_cuda_graph():
    from voxflow.kernels.gate_up_silu import gate_up_silu
    h, w = inputs(64, 1024, 3072, torch.bfloat16, 9)
    eager = gate_up_silu(h, w, EPS)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gate_up_silu(h, w, EPS)
    h.mul_(-0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gate_up_silu(h, w, EPS)) and not torch.equal(out, eager)
