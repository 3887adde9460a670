"""Programmatic dependent launch (PDL) for the decode kernels: the next kernel starts while this one finishes.

Why: at one row a code-predictor layer step is four kernels of a few microseconds each for ~1.7 us of weight reads
apiece (benchmarks/results/h200/2026-12-01-session9/call3/profile_step_1_256.txt): much of the rest is each
kernel's start (launch, getting its programs onto the SMs) and tail, paid 70 times a frame. With PDL (Hopper's
griddepcontrol, Triton's `launch_pdl`), a kernel launched behind another may be scheduled as soon as every program
of the one before has passed its own wait; its programs then wait (`gdc_wait`) for the previous kernel's results
to be complete and visible before they read or write anything. So its launch and start overlap the previous
kernel's work.

Measured on the H200 (benchmarks/results/h200/2026-12-02-session10/, calls 1, 3 and 4): a frame's code-predictor
predict at one row 2196 -> 1941 us; c=1 step 4.14 -> 4.00 ms, HTTP c=1 RTF 0.054 -> 0.052; c=8 and c=64 unchanged
(few PDL kernels run above one row). A first version that also prefetched each program's weight rows into L2
before the wait gained less (predict 2198 -> 2136 us): removed. (Both versions slow down a micro-benchmark made of
nothing but fused layer steps, 22.3 -> 27.4 us a step; the real frame, with sampling and embedding kernels between
the layers, gains.) Session 12 (2026-12-02-session12, call 3) gave it to the other decode kernels between those
GEMMs (qk_norm_rope, the paged decode and its split merge, select_tokens, the code predictor's attention above one
row: 84 + 16 launches a c=1 step that broke the chain): c=1 step 3.63 -> 3.53 ms, HTTP RTF 0.047 -> 0.046; c=64
unchanged (9.19 ms: its GEMMs are cuBLAS's, which do not take part).

Rules every PDL kernel here keeps: nothing is loaded (except the weight preload below) or written before
`wait_for_previous_kernel(USE_PDL)` (tests/test_kernels_compile.py checks the PTX order), and
`gdc_launch_dependents()` comes after the wait (or never: the exit trigger, `trigger_mode` below), so at most two
kernels of a stream overlap and a kernel's completion implies its predecessor's. A kernel launched without PDL
behind a PDL one waits as usual, and so does a PDL kernel behind one that never triggers (a torch op, cuBLAS): it
starts when that kernel has finished. Numerics do not change (the same
loads and arithmetic; only the preload's weight loads come before the wait). Captured into CUDA graphs the
launches keep their programmatic dependency (CUDA 12.3+); tests/gpu/test_gpu_pdl.py holds on / off to equal bits,
graphed too.

The switch: `voxflow.kernels.use_pdl` (on by default on Hopper or newer; VOXFLOW_PDL=0 turns it off). Under
Triton's interpreter (CPU tests) the kernels compile without these instructions (USE_PDL is a constexpr and
False there).

Weight preload (`weight_preload`; on by default for the one-row GEMMs whose N and K are both >= PRELOAD_MIN_WIDTH =
2048, VOXFLOW_PDL_PRELOAD=0 turns it off): the one-row GEMM kernels (norm_linear.py, skinny_linear.py) load their
first K step of WEIGHT tiles into registers before the wait, the one exception to the rule above. Weights are
written only at load, cast or fuse time, never by a kernel of a decode step (a fused weight re-made eagerly after a
weight was replaced is a torch op, which never triggers an early start), so the values are the same; only their
loads move ahead, into the time the kernel before is still running, so HBM keeps streaming across the kernel
boundary instead of idling through each kernel's start. (Unlike session 10's L2 prefetch, which issued one
prefetch instruction per 128-byte line before the wait, these are the kernel's own vector loads, issued once.)
The PTX test checks that only those variants load before the wait, and that no variant stores before it.
Measured (H200 session 28 call 1): the talker's one-row layer step 41.2 -> 39.1 us, but the code predictor's real
frame 1,908 -> 2,143 us (its micro-benchmark of fused layer steps alone: 25.6 -> 24.3) and the 1.7B c=1 step 3.41
-> 3.55 ms. Limited to the talker's widths (VOXFLOW_PDL_PRELOAD_MIN_WIDTH=2048, the default), call 2: c=1 step
3.42 -> 3.36 ms, RTF 0.044 -> 0.043, 22.82 -> 23.28 audio-s/s.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl


# A kernel's USE_PDL constexpr: OFF (launched plainly), EARLY (the next kernel may start right after this one's
# wait) or EXIT (the next kernel is launched when all of this one's programs have exited -- the implicit trigger --
# so its programs are placed on SMs this one has left rather than squeezed in beside it). True / False mean EARLY /
# OFF. Which kinds take EXIT: `trigger_mode`.
OFF, EARLY, EXIT = 0, 1, 2


@triton.jit
def wait_for_previous_kernel(MODE: tl.constexpr):
    """The point after which a PDL kernel may read what the kernel before it wrote, and write at all; then (EARLY)
    let the next kernel start."""
    tl.extra.cuda.gdc_wait()
    if MODE == 1:               # EARLY
        tl.extra.cuda.gdc_launch_dependents()


# Kernel kinds launched with EXIT where they do not preload weights: attention_o_proj (the code predictor's fused
# layers' K2) by default; VOXFLOW_PDL_EXIT (comma-separated kinds, empty for none; read at import) for A/B runs.
# Why: under EARLY the next kernel's programs are placed beside this one's wherever an SM has room, and that placement
# carries from kernel to kernel. H200, session 30 (benchmarks/results/h200/2026-12-04-session30/):
# - call 2, one code-predictor step of 5 fused layers + lm_head (probe_cp_step_chain.py), EARLY everywhere: 134.1 us
#   in a chain of its own, 109.7 with a projection GEMM in front (the attention kernel 10.3 vs 6.8 us); EXIT
#   everywhere: 108.7 and 112.2, but the whole 1.7B c=1 step 3.287 -> 3.472 ms (the talker's preloads need EARLY);
# - call 3, EXIT on attention_o_proj alone: 109.6 and 109.8 (draw + projection as served 117.3 vs 117.5);
# - call 4, the 1.7B c=1 step 3.287 -> 3.242 ms (the fused 2-token first step no longer slow); the talker's small
#   kernels on EXIT too: no faster (qk_norm_rope 3.260, paged_decode 3.246, combine_splits 3.277).
EXIT_KINDS = ("norm_linear", "skinny_linear", "attention_o_proj", "select_tokens", "qk_norm_rope", "paged_decode",
              "combine_splits")
_exit = frozenset(filter(None, os.environ.get("VOXFLOW_PDL_EXIT", "attention_o_proj").split(",")))
if not _exit <= set(EXIT_KINDS):
    raise ValueError(f"VOXFLOW_PDL_EXIT: unknown kinds {sorted(_exit - set(EXIT_KINDS))} (known: {EXIT_KINDS})")


def trigger_mode(pdl: bool, kind: str, preload: bool = False) -> int:
    """USE_PDL for a kernel of `kind` (EXIT_KINDS) launched with PDL `pdl` and weight preload `preload`."""
    assert kind in EXIT_KINDS, kind
    if not pdl:
        return OFF
    return EXIT if kind in _exit and not preload else EARLY


_preload = os.environ.get("VOXFLOW_PDL_PRELOAD", "1") not in ("0", "false", "off")      # (as VOXFLOW_PDL)
# Only GEMMs whose N and K are both at least this wide preload: 2048 takes the 1.7B talker's one-row layers and not
# the code predictor's (hidden 1024), whose real frame went slower with the preload (H200 session 28 call 1; again
# in session 30 call 5 with its attention on the exit trigger: a step 117.4 -> 134.5 us, the c=1 step 3.21 -> 3.45 ms).
PRELOAD_MIN_WIDTH = int(os.environ.get("VOXFLOW_PDL_PRELOAD_MIN_WIDTH", "2048"))


def set_weight_preload(on: bool) -> None:
    global _preload
    _preload = bool(on)


def weight_preload(pdl: bool, n: int = 1 << 30, k: int = 1 << 30, m: int = 1) -> bool:
    """Whether a kernel launched with PDL `pdl` preloads the weights of its [n, k] GEMM on m rows before the wait:
    PDL on, the switch on, one row (the one-row kernels' peeled first K step), N and K >= PRELOAD_MIN_WIDTH. (A
    caller's explicit preload=True bypasses this, for A/B runs; without PDL there is no wait to move loads ahead of,
    so it changes nothing there.)"""
    return pdl and _preload and m == 1 and min(n, k) >= PRELOAD_MIN_WIDTH


def launch_kwargs(pdl: bool) -> dict:
    """Extra launch options for a kernel launched with PDL (none otherwise: the interpreter takes no such option)."""
    return {"launch_pdl": True} if pdl else {}
