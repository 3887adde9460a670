"""Programmatic dependent launch (PDL) for the decode kernels: the next kernel starts while this one finishes.

Why: at one row a code-predictor layer step is four kernels of ~5 us each on an H200 for ~1.7 us of weight reads
apiece (benchmarks/results/h200/2026-12-01-session9/call3/profile_step_1_256.txt): the rest is each kernel's
start (launch, the first loads' latency) and tail, paid 70 times a frame. With PDL (Hopper's griddepcontrol,
Triton's `launch_pdl`), a kernel launched behind another may start as soon as every program of the one before has
passed its own wait; it then issues L2 prefetches of its WEIGHT rows, which no kernel of the step writes, and
only then waits (`gdc_wait`) for the previous kernel's results to be complete and visible before it reads any
activation. So the weight traffic of kernel N+1 overlaps the tail of kernel N.

Rules every PDL kernel here keeps: nothing is loaded (only weights prefetched) and nothing written before
`gdc_wait()` (tests/test_kernels_compile.py checks the PTX order);
`gdc_launch_dependents()` comes after the wait, so at most two kernels of a stream overlap and a kernel's
completion implies its predecessor's. A kernel launched without PDL behind a PDL one waits as usual. Numerics do
not change (the same loads and arithmetic after the wait). Captured into CUDA graphs, the launches should keep
their programmatic dependency (CUDA 12.3+); tests/gpu/test_gpu_pdl.py holds on / off to equal bits, graphed too.

The switch: `voxflow.kernels.use_pdl` (off by default until measured). Under Triton's interpreter (CPU tests) the
kernels compile without these instructions (USE_PDL is a constexpr and False there).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

# One prefetch per 128-byte line; lines per prefetch batch (the tile of pointers one loop step builds).
LINE_BYTES = tl.constexpr(128)
LINES_PER_STEP = tl.constexpr(16)
# VOXFLOW_PDL_PREFETCH=0 (read at import): PDL kernels skip the weight prefetch and only wait, so the overlap is
# the next kernel's launch and start alone (H200 session 10: with the prefetch a fused layer step was slower).
PREFETCH = tl.constexpr(os.environ.get("VOXFLOW_PDL_PREFETCH", "1") != "0")


@triton.jit
def prefetch_rows_l2(row_ptrs, row_mask, k_lo, k_len, LINES: tl.constexpr):
    """L2 prefetches of row_ptrs [R, 1] + [k_lo, k_lo + k_len) elements, one per 128-byte line, LINES lines a
    step; rows where row_mask [R, 1] is False are skipped. Nothing waits for them: the loads that follow hit L2."""
    line: tl.constexpr = LINE_BYTES * 8 // row_ptrs.dtype.element_ty.primitive_bitwidth     # elements a line
    if PREFETCH:
        for l0 in range(0, k_len, line * LINES):
            cols = k_lo + l0 + tl.arange(0, LINES) * line
            ok = row_mask & (cols[None, :] < k_lo + k_len)
            tl.inline_asm_elementwise(
                asm="{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
                constraints="=r,l,r", args=[row_ptrs + cols[None, :], ok.to(tl.int32)], dtype=tl.int32,
                is_pure=False, pack=1)


@triton.jit
def wait_for_previous_kernel():
    """The point after which a PDL kernel may read what the kernel before it wrote, and write at all; then let the
    next kernel start."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


def launch_kwargs(pdl: bool) -> dict:
    """Extra launch options for a kernel launched with PDL (none otherwise: the interpreter takes no such option)."""
    return {"launch_pdl": True} if pdl else {}
