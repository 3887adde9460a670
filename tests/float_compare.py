"""Comparing floating-point results in units in the last place (shared by the kernel tests, CPU and GPU)."""
from __future__ import annotations

import torch

_INT = {torch.float32: (torch.int32, 0x7FFFFFFF), torch.bfloat16: (torch.int16, 0x7FFF),
        torch.float16: (torch.int16, 0x7FFF)}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units in the last place of their (common) dtype, element-wise; finite inputs."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    int_dtype, magnitude = _INT[a.dtype]

    def ordered(t):   # IEEE bit patterns -> integers in the order of the values (+0 and -0 both 0)
        i = t.contiguous().view(int_dtype).to(torch.int64)
        return torch.where(i < 0, -(i & magnitude), i)
    return (ordered(a) - ordered(b)).abs()


def assert_within_ulp(got: torch.Tensor, expect: torch.Tensor, ulps: int) -> None:
    assert got.shape == expect.shape and got.dtype == expect.dtype, (got.shape, got.dtype, expect.dtype)
    dist = ulp_distance(got, expect)
    exact = (dist == 0).float().mean().item()
    assert int(dist.max()) <= ulps, (f"max {int(dist.max())} ulp > {ulps} ({exact:.1%} bit-equal, "
                                     f"max abs {(got.float() - expect.float()).abs().max()})")
