"""The end of a Qwen3-TTS decode step -- the batch's new per-slot state scattered back and its finished / EOS flags
-- in one Triton kernel (`models/qwen3_tts/slots.SlotTable.write_back` is the torch reference).

The reference is ~12 small torch kernels (a clamp, an int16 cast and an index_put for the frame history, index_puts
for `seen`, c0, h and fed, the comparisons for the flags, then the engine's stack of the two flags): each ~1-3 us
plus a launch gap on the c=1 step's critical path, ~20 us a step on the H200 (session 30 call 5's timeline).
Here one program per batch row does it all. It only moves data and compares integers, so it equals the reference
exactly. Padding rows of a CUDA-graph bucket all name the scratch slot: their writes race there, which is harmless
(nothing reads the scratch row's state as a result).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _slot_write_back_kernel(rows_ptr, fed_ptr, frame_ptr, c0_next_ptr, hidden_ptr, max_frames_ptr,
                            c0_tab_ptr, fed_tab_ptr, h_ptr, seen_ptr, hist_ptr, flags_ptr,
                            eos_id, hidden_size, hist_frames,
                            stride_frame, stride_hidden, stride_h, stride_seen, stride_hist_slot, stride_hist_frame,
                            GROUPS: tl.constexpr, BLOCK_H: tl.constexpr):
    i = tl.program_id(0)
    slot = tl.load(rows_ptr + i)
    fed = tl.load(fed_ptr + i)
    nxt = fed + 1
    c0 = tl.load(c0_next_ptr + i)
    # history[slot, min(fed, F - 1)] = frame (clamped: a finished slot may be decoded once more, engine.py)
    g = tl.arange(0, GROUPS)
    at = tl.minimum(fed, hist_frames - 1)
    codes = tl.load(frame_ptr + i * stride_frame + g)
    tl.store(hist_ptr + slot * stride_hist_slot + at * stride_hist_frame + g, codes.to(tl.int16))
    tl.store(seen_ptr + slot * stride_seen + c0, 1)
    tl.store(c0_tab_ptr + slot, c0)
    tl.store(fed_tab_ptr + slot, nxt)
    for start in range(0, hidden_size, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        mask = cols < hidden_size
        tl.store(h_ptr + slot * stride_h + cols, tl.load(hidden_ptr + i * stride_hidden + cols, mask=mask),
                 mask=mask)
    eos = c0 == eos_id
    finished = eos | (nxt >= tl.load(max_frames_ptr + i))
    tl.store(flags_ptr + i * 2, finished.to(tl.int8))
    tl.store(flags_ptr + i * 2 + 1, eos.to(tl.int8))


def slot_write_back(rows: torch.Tensor, fed: torch.Tensor, frame: torch.Tensor, c0_next: torch.Tensor,
                    hidden: torch.Tensor, max_frames: torch.Tensor, eos_id: int, c0_tab: torch.Tensor,
                    fed_tab: torch.Tensor, h: torch.Tensor, seen: torch.Tensor, history: torch.Tensor
                    ) -> torch.Tensor:
    """Writes row b's state into slot rows[b] (history[slot, fed] = frame, seen[slot, c0_next], c0 / fed / h) and
    returns flags [B, 2] bool (finished, eos). rows / fed / c0_next / max_frames [B] int64, frame [B, G] int64,
    hidden [B, H] (rows contiguous); c0_tab / fed_tab [slots] int64 (unit stride: rows of the scalar table),
    h [slots, H], seen [slots, V] bool, history [slots, F, G] int16."""
    b, groups = frame.shape
    hidden_size = hidden.shape[1]
    assert hidden.stride(1) == 1 and h.stride(1) == 1 and frame.stride(1) == 1 and seen.stride(1) == 1
    assert history.stride(2) == 1 and c0_tab.stride(0) == 1 and fed_tab.stride(0) == 1 and groups & (groups - 1) == 0
    rows, fed, c0_next, max_frames = (t.contiguous() for t in (rows, fed, c0_next, max_frames))
    flags = torch.empty(b, 2, dtype=torch.bool, device=frame.device)
    _slot_write_back_kernel[(b,)](
        rows, fed, frame, c0_next, hidden, max_frames, c0_tab, fed_tab, h, seen.view(torch.int8), history,
        flags.view(torch.int8), int(eos_id), hidden_size, history.shape[1],
        frame.stride(0), hidden.stride(0), h.stride(0), seen.stride(0), history.stride(0), history.stride(1),
        GROUPS=groups, BLOCK_H=min(1024, triton.next_power_of_2(hidden_size)))
    return flags
