"""Decode GEMMs of a batch of rows (9..64: above the skinny layer path's sizes) through the Triton skinny GEMM.

Why: at 64 rows cuBLAS's GEMMs in a decode step take 5.7-7.4 us each for ~2 us of weight reads, and ~400 of them
make half of the 0.6B c=64 step (H200 session 24 call 5: 2.82 of 5.68 ms). Their grids leave SMs idle at these
widths, the split-K ones add a reduce launch, and none takes part in programmatic dependent launch, so each one's
start waits for the previous kernel's end. voxflow/kernels/skinny_linear.py at these rows uses tensor cores with
BLOCK_N ~ N / 128 (>= ~128 programs), has the residual add in its epilogue, and launches with PDL.

Numerics: fp32 sums rounded once to the dtype, the residual add rounded after (the unfused torch code's rounding
points); only the order of the fp32 sums differs from cuBLAS's (tests/test_batch_linear.py holds it to F.linear).

The switch: BATCH_SKINNY (VOXFLOW_BATCH_SKINNY=1), off until an H200 step profile says it wins; everywhere it is
off or the sizes do not fit, the torch code runs (F.linear, an add).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from voxflow.kernels import use_kernels

BATCH_SKINNY = os.environ.get("VOXFLOW_BATCH_SKINNY", "0") == "1"
# The grid size the GEMMs aim at (BLOCK_N ~ N / PROGRAMS, 16..128), where set; unset: skinny_linear's own launch
# heuristic (~128 programs, one per SM of an H200). An experiment's knob (VOXFLOW_BATCH_SKINNY_PROGRAMS): at c=64 the
# codec's kernels hold half the SMs during most steps (engine/sm_partition.py), and a grid sized for the whole GPU
# may then wait on them (H200 session 25 call 2).
PROGRAMS = int(os.environ.get("VOXFLOW_BATCH_SKINNY_PROGRAMS", "0")) or None
# Fewer rows take the layers' own few-row paths (qwen3_layer.SKINNY_MAX_ROWS: skinny_linear with its fused
# prologues, norm_linear), tuned for them; more than skinny_linear.MAX_M go to cuBLAS.
MIN_ROWS = 9


def _skinny_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """x as [rows, K] when the switch is on and the skinny GEMM takes (rows, w); else None."""
    if not (BATCH_SKINNY and use_kernels(x)):
        return None
    from voxflow.kernels import skinny_linear as sk      # imported lazily: CPU runs never load Triton code
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.shape[0] >= MIN_ROWS and sk.supported(rows, w) else None


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) (no bias) for x [..., K]."""
    rows = _skinny_rows(x, w)
    if rows is None:
        return F.linear(x, w)
    from voxflow.kernels import skinny_linear as sk
    return sk.skinny_linear(rows, w, config=_config(w)).view(*x.shape[:-1], w.shape[0])


def linear_plus(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, in_place: bool) -> torch.Tensor | None:
    """residual + F.linear(x, w) for x [rows, K], residual [rows, N], into `residual` itself when in_place (it must
    then be the caller's own buffer); None when the switch is off or the sizes do not fit (the caller's own path
    runs)."""
    rows = _skinny_rows(x, w)
    if rows is None:
        return None
    from voxflow.kernels import skinny_linear as sk
    return sk.skinny_linear(rows, w, residual=residual, out=residual if in_place else None, config=_config(w))


def _config(w: torch.Tensor) -> dict | None:
    """skinny_linear's config override for weight w [N, K]: PROGRAMS' BLOCK_N, or None (its own heuristic)."""
    if PROGRAMS is None:
        return None
    block_n = 1 << max(0, (w.shape[0] // PROGRAMS).bit_length() - 1)
    return {"BLOCK_N": min(128, max(16, block_n))}
