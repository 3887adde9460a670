"""Weights pulled into L2 while the step's stream does latency-bound work, for the GEMM that reads them next.

Why: at one row the talker's layer is seven kernels; four of them (q/k norm + RoPE, paged attention, its split merge,
o_proj) read little from HBM (~9 MB of 100 MB a layer) for ~13 us of the layer's ~42 (H200 session 29, call 1's
step timeline), while gate|up, right after them, streams 50 MB at ~3.5 TB/s. So HBM idles through the attention.
`prefetch_l2(w, nbytes)` is one small kernel in the chain, placed before the attention: its programs ask the SMs'
bulk-copy units (Hopper's `cp.async.bulk.prefetch.L2`, one instruction per chunk, fire and forget) to bring the
first `nbytes` of the next GEMM's weights into L2 (50 MB on an H200), so that GEMM finds them there.

Chain rules (pdl.py): the prefetches touch only weights, which nothing in a decode step writes, so they are issued
before the kernel's wait; the program then waits for the kernel ahead (so that its completion implies the previous
kernel's, as every kernel of the chain keeps) and lets the next one start. Only hints: no numerics change, and a
prefetch that comes too late or is evicted costs bandwidth, not correctness.

(Session 27 tried prefetches for the code predictor's GEMMs from a side stream: its kernels wait on the chain of
launches, not on HBM, and the fork / join cost more than they saved. The talker's GEMMs are bandwidth-bound.)
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, wait_for_previous_kernel

SLOTS = 32          # prefetch instructions a program issues at most (one per lane of its single warp)


@triton.jit
def _prefetch_l2_kernel(ptr, nbytes, chunk, SLOTS: tl.constexpr, USE_PDL: tl.constexpr):
    """Bulk L2 prefetches of ptr[0:nbytes] (bytes; 16-byte aligned, chunk a multiple of 16): chunk bytes each,
    program p taking chunks p, p + programs, ... (SLOTS of them); then the chain's wait."""
    idx = tl.program_id(0) + tl.arange(0, SLOTS) * tl.num_programs(0)
    start = idx.to(tl.int64) * chunk
    ok = start < nbytes
    size = tl.minimum(nbytes - start, chunk).to(tl.int32)
    tl.inline_asm_elementwise(
        asm="{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        constraints="=r,l,r,r", args=[ptr + start, size, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    if USE_PDL:
        wait_for_previous_kernel()


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def applies(w: torch.Tensor) -> bool:
    """Whether `prefetch_l2` issues anything for w: a CUDA tensor on Hopper or newer (the bulk prefetch
    instruction), contiguous and 16-byte aligned. (The caller decides whether the kernels are on at all.)"""
    return (w.is_cuda and torch.version.hip is None and w.is_contiguous() and w.data_ptr() % 16 == 0
            and _hopper(w.device.index if w.device.index is not None else 0))


def chunking(nbytes: int, programs: int, slots: int = SLOTS) -> int:
    """Bytes per prefetch instruction so that programs x slots chunks cover nbytes: a multiple of 16."""
    per = -(-nbytes // (programs * slots))
    return max(16, -(-per // 16) * 16)


def prefetch_l2(w: torch.Tensor, nbytes: int, programs: int) -> None:
    """Launch the prefetch of w's first nbytes (rounded down to 16) into L2, as one kernel of the step's chain
    (`applies(w)` must hold)."""
    nbytes = min(nbytes, w.numel() * w.element_size()) // 16 * 16
    if nbytes <= 0 or programs < 1:
        return
    pdl = use_pdl(w)
    _prefetch_l2_kernel[(programs,)](w.view(-1).view(torch.uint8), nbytes, chunking(nbytes, programs),
                                     SLOTS=SLOTS, USE_PDL=pdl, num_warps=1, **launch_kwargs(pdl))
