"""Weights pulled into L2 ahead of the kernel that reads them, by a side branch of the step's CUDA graph.

Why: at one row the code predictor's layer step is four kernels of ~5 us for ~8 us of weight reads in all at the
H200's bandwidth (a layer's 31 MB; H200 session 24 call 5, 22 us a layer step). Each kernel's programs stream
their weight rows with a few loads in flight, so they wait on HBM's latency, not its bandwidth. The weights are
the same every step and nothing writes them, so they can be read early: `WeightPrefetch.issue(w)` launches a
one-program kernel on a side stream that asks the copy engine of the SM (Hopper's `cp.async.bulk.prefetch.L2`,
one instruction per chunk, nothing waits for it) to bring `w` into L2, while the main stream's kernels run. The
kernel that reads `w` later then finds it in L2 (50 MB on an H200; a code-predictor layer's largest matrix is
12.6 MB).

The side stream forks from the caller's current stream at `issue` (so the prefetch starts once the kernels
launched before it are done) and joins back at `join`: captured into a CUDA graph this is a branch of the graph
beside the main chain, which it never delays. Only hints are issued: no numerics change, and a prefetch that comes
too late or is evicted costs bandwidth, not correctness.

Switch: VOXFLOW_L2_PREFETCH=N (N kernels ahead; 0 off, the default until measured on the GPU). Taken on CUDA
tensors of compute capability >= 9 when the kernels are on (`use_kernels`); a no-op elsewhere (CPU, the
interpreter, older GPUs).
"""
from __future__ import annotations

import functools
import os

import torch

import triton
import triton.language as tl

from voxflow.kernels import use_kernels

AHEAD = int(os.environ.get("VOXFLOW_L2_PREFETCH", "0"))
PROGRAMS = int(os.environ.get("VOXFLOW_L2_PREFETCH_PROGRAMS", "2"))    # programs (SMs) a prefetch launch takes
DRY = False             # measuring only: launch the branch's kernels with nothing to prefetch (the fork's own cost)
_SLOTS = 128            # chunks a program issues at most: one per thread (4 warps)


@triton.jit
def _l2_prefetch_kernel(ptr, nbytes, chunk, SLOTS: tl.constexpr):
    """Bulk L2 prefetches of ptr[0:nbytes] (bytes; 16-byte aligned, nbytes and chunk multiples of 16): chunk bytes
    each, SLOTS chunks a program, program p taking chunks p, p + programs, ..."""
    idx = tl.program_id(0) + tl.arange(0, SLOTS) * tl.num_programs(0)
    start = idx.to(tl.int64) * chunk
    ok = start < nbytes
    size = tl.minimum(nbytes - start, chunk).to(tl.int32)
    tl.inline_asm_elementwise(
        asm="{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        constraints="=r,l,r,r", args=[ptr + start, size, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def applies(t: torch.Tensor) -> bool:
    """Whether prefetches for tensors like `t` are issued (switch on, kernels on, a Hopper or newer CUDA device)."""
    return AHEAD > 0 and use_kernels(t) and _hopper(t.device.index if t.device.index is not None else 0)


def chunking(nbytes: int, programs: int, slots: int = _SLOTS) -> int:
    """Bytes per prefetch instruction so that `programs` x `slots` chunks cover nbytes: a multiple of 16."""
    per = -(-nbytes // (programs * slots))
    return max(16, -(-per // 16) * 16)


class WeightPrefetch:
    """Forks L2 prefetches of weights onto a side stream (`issue`) and joins it back (`join`). One per model; the
    side stream is made on first use, per device."""

    def __init__(self, programs: int | None = None):
        self.programs = programs            # None: PROGRAMS at each issue
        self._side: dict[int, torch.cuda.Stream] = {}
        self._pending: set[int] = set()

    def issue(self, w: torch.Tensor) -> bool:
        """Start bringing w (contiguous, 16-byte aligned, a multiple of 16 bytes) into L2 once the work already
        queued on the current stream is done; False (nothing issued) where it does not apply."""
        nbytes = w.numel() * w.element_size()
        if (not applies(w) or not w.is_contiguous() or w.data_ptr() % 16 or nbytes % 16 or nbytes == 0
                or nbytes >= 2 ** 31):
            return False
        index = w.device.index if w.device.index is not None else torch.cuda.current_device()
        side = self._side.get(index)
        if side is None:
            side = self._side[index] = torch.cuda.Stream(w.device)
        side.wait_stream(torch.cuda.current_stream(w.device))
        programs = self.programs or PROGRAMS
        with torch.cuda.stream(side):
            _l2_prefetch_kernel[(programs,)](w.view(-1).view(torch.uint8), 0 if DRY else nbytes,
                                             chunking(nbytes, programs),
                                             SLOTS=_SLOTS, num_warps=4)
        self._pending.add(index)
        return True

    def join(self, device: torch.device) -> None:
        """Order the current stream after every prefetch issued on `device` (a graph capture must end with its side
        branches joined)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index in self._pending:
            torch.cuda.current_stream(device).wait_stream(self._side[index])
            self._pending.discard(index)

