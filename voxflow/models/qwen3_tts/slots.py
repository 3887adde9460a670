"""Persistent per-slot decode state of the Qwen3-TTS plugin: one row per slot in device tensors, so that a
decode step gathers its batch's rows and scatters them back with index ops (no per-request Python loop).

Per slot:
    c0            the pending codebook-0 code (sampled, its frame not yet completed)
    h             the talker hidden state that produced c0 (input of the code predictor)
    fed           frames completed and fed back so far (= index of the pending frame)
    prompt_len    P, so that the next talker position is P + fed
    trailing      L trailing-text rows (+ trailing_len); row k is added to frame k's input, tts_pad after. Kept
                  in PAGES of TEXT_PAGE_ROWS rows shared by all slots (a page table per slot), so one long text takes
                  pages the short ones leave free instead of growing every slot's buffer
    history       [F, 16] the frames fed back (int16), for re-prefill after preemption
    seen          [V] bool: c0 ids generated so far (repetition penalty)
    sampling      do_sample / temperature / top_k / top_p for c0 (t_*) and codes 1..15 (cp_*), penalty,
                  min_new_tokens (huge when ignore_eos: EOS is then never drawn), key (seed_key), max_frames
The text pages and the history grow (at attach, never inside decode) when a request needs more than they hold:
a growth reallocates them, which bumps `version`, and every CUDA graph that captured the old buffers is captured
again as its batch size comes up (150-260 ms each for the 1.7B talker on an H200: a stall of every stream). So they
start large: as many text pages as 256 rows a slot (a text longer than that only needs others to be shorter; the
session-7 voice-clone benchmark's first long text grew the per-slot buffers of the time) and as many frames as the
engine lets a request have (its max_model_len; 8192 when built without one).

Row `max_slots` is a scratch row that no request owns: padded batch rows (CUDA-graph buckets) read and write it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ...engine.host_to_device import tensor_to, to_device
from ...kernels import use_kernels
from .sampling import WarpParams

NEVER = 1 << 62      # min_new_tokens that is never reached (ignore_eos)
TEXT_PAGE_ROWS = 32  # trailing-text rows per page
# The decode step's write-back as one fused kernel on a GPU (VOXFLOW_WRITE_BACK_KERNEL=0: the torch ops, for A/B).
WRITE_BACK_KERNEL = os.environ.get("VOXFLOW_WRITE_BACK_KERNEL", "1") != "0"
# ... and its input (frame embedding + trailing text, positions) as another, bit-exact against the torch ops (H200
# session 32: GPU tests passed; 1.7B c=1 E2E 484.0 -> 481.1 ms). VOXFLOW_FRAME_INPUT_KERNEL=0: the torch ops.
FRAME_INPUT_KERNEL = os.environ.get("VOXFLOW_FRAME_INPUT_KERNEL", "1") != "0"
# With it, also the sum of the frame's 16 embedding rows (torch's stack + sum before: ~8 us a step at c=1), in fp32
# in row order, where torch's reduction may add in another order: in bf16 nearly always the same bits, else one
# ulp of the sum; in fp32 within the ordering error of a 16-term sum (the fp32 engine's GPU test holds the codes to
# the CPU reference with it on; session 32: E2E 481.1 -> 480.3 ms). VOXFLOW_FRAME_SUM_KERNEL=0: torch's sum.
FRAME_SUM_KERNEL = os.environ.get("VOXFLOW_FRAME_SUM_KERNEL", "1") != "0"


def _grow(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if t.shape[dim] >= size:
        return t
    if t.is_cuda:
        # The old buffer is dropped while a decode queued on the current stream may still read it; it may have
        # been allocated on another stream (the table is built while the model loads, the engine may step on a
        # stream of its own: engine_stream.py), so tell the allocator to wait for this one before reusing it.
        t.record_stream(torch.cuda.current_stream(t.device))
    shape = list(t.shape)
    shape[dim] = max(size, 2 * t.shape[dim])
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


# The per-slot scalars, one 2-D tensor [names, slots] per dtype with a named row each (the attributes are row
# views): a request's attach writes its column of each from one host-to-device copy and one device copy into the
# strided column, 8 launches instead of ~20 one-element fills, a kernel launch apiece on the engine thread (the
# H200 c=64 trace: a wave of 56 prefills took 20.6 ms of host time, 0.37 ms a request; how much of it these
# launches were is not isolated); and a decode step gathers its batch's values of all of a dtype's names in one
# index_select (`gather`: 4 launches instead of ~16, each ~2 us on the c=1 step's critical path, H200 session 29
# call 1's timeline), each name's values a contiguous row of the result.
SCALARS = {
    torch.long: ("c0", "fed", "prompt_len", "trailing_len", "t_top_k", "cp_top_k", "min_new_tokens", "key",
                 "max_frames"),
    torch.float32: ("t_temperature", "cp_temperature", "penalty"),
    torch.float64: ("t_top_p", "cp_top_p"),
    torch.bool: ("t_do_sample", "cp_do_sample"),
}


@dataclass
class SlotLoad:
    """One request's constant decode data for `SlotTable.load_many` (params: sampling.SamplingParams; trailing: its
    [L, H] trailing-text rows)."""
    slot: int
    params: object
    key: int
    prompt_len: int
    max_frames: int
    ignore_eos: bool
    trailing: torch.Tensor

    def scalars(self) -> dict:
        """Every SCALARS name's value for this request (its counters reset)."""
        p = self.params
        return {
            "trailing_len": self.trailing.shape[0], "prompt_len": self.prompt_len, "max_frames": self.max_frames,
            "key": self.key,
            # Greedy rows get a neutral temperature, as WarpParams.build does, so their (unused) warp stays finite.
            "t_do_sample": p.do_sample, "t_temperature": p.temperature if p.do_sample else 1.0,
            "t_top_k": int(p.top_k), "t_top_p": p.top_p,
            "cp_do_sample": p.subtalker_do_sample,
            "cp_temperature": p.subtalker_temperature if p.subtalker_do_sample else 1.0,
            "cp_top_k": int(p.subtalker_top_k), "cp_top_p": p.subtalker_top_p,
            "penalty": p.repetition_penalty, "min_new_tokens": NEVER if self.ignore_eos else p.min_new_tokens,
            "c0": 0, "fed": 0,
        }


class SlotTable:
    SNAPSHOT = ("c0", "h", "fed", "seen")

    def __init__(self, max_slots: int, hidden: int, vocab: int, num_groups: int, dtype: torch.dtype,
                 device: torch.device, trailing_cap: int = 256, history_cap: int = 8192):
        n = max_slots + 1           # + the scratch row
        self.version = 0
        z = dict(device=device)
        self._scalars = {kind: torch.zeros(len(names), n, dtype=kind, **z) for kind, names in SCALARS.items()}
        _name_rows(self, self._scalars)
        for name in ("t_temperature", "cp_temperature", "penalty", "t_top_p", "cp_top_p"):
            getattr(self, name).fill_(1)           # neutral values for rows no request has written yet
        self.h = torch.zeros(n, hidden, dtype=dtype, **z)
        # Trailing text: `text_pages` [pages, TEXT_PAGE_ROWS, H] shared by all slots; slot s's row k is
        # text_pages[text_table[s, k // TEXT_PAGE_ROWS], k % TEXT_PAGE_ROWS]. Page 0 is never handed out (the
        # table's unused entries point at it: whatever a masked read finds there is discarded).
        # A table row can hold every page: one slot may take them all (int64 [n, pages]: 260 KB at 64 slots).
        pages = max_slots * -(-trailing_cap // TEXT_PAGE_ROWS)
        self.text_pages = torch.zeros(1 + pages, TEXT_PAGE_ROWS, hidden, dtype=dtype, **z)
        self.text_table = torch.zeros(n, pages, dtype=torch.long, **z)
        self._free_pages = list(range(pages, 0, -1))            # host free list, popped from the end
        self._slot_pages: dict[int, list[int]] = {}
        self.history = torch.zeros(n, history_cap, num_groups, dtype=torch.int16, **z)
        self.seen = torch.zeros(n, vocab, dtype=torch.bool, **z)
        self._true = torch.ones((), dtype=torch.bool, **z)       # (a Python True would sync to copy)

    # ---- attach ------------------------------------------------------------------------------------
    def load(self, slot: int, *, params, key: int, prompt_len: int, max_frames: int, ignore_eos: bool,
             trailing: torch.Tensor) -> None:
        """Write a request's constant data (params: sampling.SamplingParams) and reset its counters."""
        self.load_many([SlotLoad(slot, params, key, prompt_len, max_frames, ignore_eos, trailing)])

    def load_many(self, loads: list["SlotLoad"]) -> None:
        """`load` for several slots (distinct) in one set of device operations: ~16 launches for all of them,
        where one at a time took ~11 each (the H200 0.6B c=64 trace: a wave's prefill steps spent 0.35-1 ms of
        host time a prompt, 31 prompts in a step; the launches are most of a GPU attach's host cost)."""
        if not loads:
            return
        history = _grow(self.history, 1, max(x.max_frames for x in loads))
        if history is not self.history:
            self.history = history
            self.version += 1
        slots = [x.slot for x in loads]
        rows = tensor_to(slots, self.h.device)
        self._load_texts(slots, rows, [x.trailing for x in loads])
        values = [x.scalars() for x in loads]
        # From pinned memory, non-blocking: `t[slot] = value` would copy a pageable host tensor in, a blocking copy
        # that waits for the decode step in flight (tests/gpu/test_gpu_no_host_sync.py). The caching host allocator
        # keeps the pinned block until its copy has run.
        for kind, names in SCALARS.items():
            block = to_device(torch.tensor([[v[k] for v in values] for k in names], dtype=kind), self.h.device)
            self._scalars[kind].index_copy_(1, rows, block)       # [names, n] into the slots' columns
        self.h.index_fill_(0, rows, 0)
        self.seen.index_fill_(0, rows, False)

    def _load_texts(self, slots: list[int], rows: torch.Tensor, texts: list[torch.Tensor]) -> None:
        """Give each slot pages for its L trailing-text rows and write them there: one scatter of all the pages and
        one write of the slots' page-table rows (device ops only, no sync)."""
        for slot in slots:
            self.release_text(slot)
        needs = [-(-t.shape[0] // TEXT_PAGE_ROWS) for t in texts]
        owned: list[list[int]] = []
        for slot, need in zip(slots, needs):               # (the pages one-at-a-time loads would give)
            if need > len(self._free_pages):
                total = self.text_pages.shape[0]
                more = max(need - len(self._free_pages), total)                  # at least double
                self.text_pages = _grow(self.text_pages, 0, total + more)
                self.text_table = _grow(self.text_table, 1, total + more - 1)
                self._free_pages.extend(range(total, total + more))
                self.version += 1
            owned.append([self._free_pages.pop() for _ in range(need)])
            if need:
                self._slot_pages[slot] = owned[-1]
        table = np.zeros((len(slots), self.text_table.shape[1]), dtype=np.int64)      # page 0: never handed out
        for i, own in enumerate(owned):
            table[i, :len(own)] = own
        pages = [page for own in owned for page in own]
        self.text_table.index_copy_(0, rows, to_device(torch.from_numpy(table), self.text_table.device))
        if not pages:
            return
        # The texts' rows into their pages, the rest of each last page zero: a zeroed block of the pages, the
        # texts concatenated, one row copy (host-computed destinations: no operation per request).
        hidden, device = self.text_pages.shape[-1], self.text_pages.device
        starts = np.cumsum([0] + needs[:-1]) * TEXT_PAGE_ROWS
        dest = np.concatenate([np.arange(t.shape[0]) + start for t, start in zip(texts, starts)])
        padded = torch.zeros(len(pages) * TEXT_PAGE_ROWS, hidden, dtype=self.text_pages.dtype, device=device)
        padded.index_copy_(0, to_device(torch.from_numpy(dest), device),
                           torch.cat(texts).to(device=device, dtype=padded.dtype))
        self.text_pages[tensor_to(pages, device)] = padded.view(len(pages), TEXT_PAGE_ROWS, hidden)

    def release_text(self, slot: int) -> None:
        """The slot's text pages back to the pool (at detach). A decode already queued that still reads them runs
        before their next owner's rows land there: `_load_texts` queues those writes on the stream the decodes
        run on."""
        self._free_pages.extend(reversed(self._slot_pages.pop(slot, [])))

    def snapshot(self, slot: int, max_frames: int) -> dict[str, torch.Tensor]:
        """Device copies of the slot's evolving state (no host sync), for `restore` after preemption."""
        snap = {name: getattr(self, name)[slot].clone() for name in self.SNAPSHOT}
        snap["history"] = self.history[slot, :max_frames].clone()
        return snap

    def restore(self, slot: int, snap: dict[str, torch.Tensor]) -> None:
        for name in self.SNAPSHOT:
            getattr(self, name)[slot] = snap[name]
        self.history[slot, :snap["history"].shape[0]] = snap["history"]

    # ---- decode-time gathers ---------------------------------------------------------------------------
    def gather(self, rows: torch.Tensor) -> "SlotRows":
        """Every scalar's values for the batch `rows`: one index_select per dtype."""
        return SlotRows({kind: tab.index_select(1, rows) for kind, tab in self._scalars.items()})

    def text_part(self, rows: torch.Tensor, frame: torch.Tensor, pad: torch.Tensor,
                  trailing_len: torch.Tensor) -> torch.Tensor:
        """[B, H]: trailing-text row `frame` of each slot, or tts_pad once its queue is used up (trailing_len: the
        rows' queue lengths, as `gather` gives them)."""
        index = frame.clamp(max=self.text_table.shape[1] * TEXT_PAGE_ROWS - 1)
        pages = self.text_table[rows, index // TEXT_PAGE_ROWS]
        text = self.text_pages[pages, index % TEXT_PAGE_ROWS]
        return torch.where((frame < trailing_len)[:, None], text, pad.to(text))

    @staticmethod
    def sums_frame_embed(like: torch.Tensor) -> bool:
        """Whether `frame_input` sums the frame's embedding rows itself (the decode asks the code predictor for
        them unsummed)."""
        return FRAME_SUM_KERNEL and FRAME_INPUT_KERNEL and use_kernels(like)

    def frame_input(self, rows: torch.Tensor, fed: torch.Tensor, trailing_len: torch.Tensor,
                    prompt_len: torch.Tensor, frame_embed, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker's input for frame `fed` of each slot `rows` -- frame_embed [B, H] plus its trailing-text row
        (text_part) -- and its position P + fed, [B]. frame_embed may also come as its parts (first [B, H], rows
        [B, 16, H] of which [:, 1:] count: CodePredictor.predict's embed_parts), summed here. On a GPU with the
        kernels on, one fused kernel (kernels/frame_input.py, equal to these torch ops; the sum of parts in
        another order: FRAME_SUM_KERNEL's note)."""
        first, parts = frame_embed if isinstance(frame_embed, tuple) else (frame_embed, None)
        if use_kernels(first) and FRAME_INPUT_KERNEL:
            from ...kernels.frame_input import frame_input
            return frame_input(first, rows, fed, trailing_len, prompt_len, self.text_table, self.text_pages, pad,
                               more_rows=parts)
        if parts is not None:           # the code predictor's own sum: the same rows, stacked in the same order
            first = torch.cat((first[:, None], parts[:, 1:]), dim=1).sum(dim=1)
        return first + self.text_part(rows, fed, pad, trailing_len), prompt_len + fed

    def record_frame(self, rows: torch.Tensor, frame_index: torch.Tensor, frame: torch.Tensor) -> None:
        # Clamped: an engine that reads `finished` one step late may decode a finished slot once more.
        self.history[rows, frame_index.clamp(max=self.history.shape[1] - 1)] = frame.to(torch.int16)

    def keep_c0(self, rows: torch.Tensor, c0: torch.Tensor, hidden: torch.Tensor) -> None:
        """Each slot's pending c0 (marked seen) and the hidden state [B, H] that produced it."""
        self.c0[rows] = c0
        self.seen.index_put_((rows, c0), self._true)
        self.h[rows] = hidden

    def write_back(self, rows: torch.Tensor, fed: torch.Tensor, frame: torch.Tensor, c0_next: torch.Tensor,
                   hidden: torch.Tensor, max_frames: torch.Tensor, eos_id: int) -> torch.Tensor:
        """The end of a decode step: frame [B, G] recorded as frame `fed` of each slot `rows`, c0_next marked seen
        and kept as the pending c0 with its hidden state [B, H], fed advanced; returns flags [B, 2] bool
        (finished: EOS drawn or the frame limit reached, eos). On a GPU with the kernels on, one fused kernel
        (kernels/slot_write_back.py, equal to these torch ops)."""
        if use_kernels(hidden) and WRITE_BACK_KERNEL:
            from ...kernels.slot_write_back import slot_write_back
            return slot_write_back(rows, fed, frame, c0_next, hidden, max_frames, eos_id, self.c0, self.fed, self.h,
                                   self.seen, self.history)
        nxt = fed + 1
        self.record_frame(rows, fed, frame)
        self.keep_c0(rows, c0_next, hidden)
        self.fed[rows] = nxt
        eos = c0_next == eos_id
        return torch.stack((eos | (nxt >= max_frames), eos), dim=1)


def _name_rows(target, tables: dict[torch.dtype, torch.Tensor]) -> None:
    """Each SCALARS name as an attribute of target: row i of its dtype's [names, ...] table."""
    for kind, names in SCALARS.items():
        for i, name in enumerate(names):
            setattr(target, name, tables[kind][i])


class SlotRows:
    """A batch's scalars (SlotTable.gather): each name an attribute, a contiguous [B] view."""

    def __init__(self, gathered: dict[torch.dtype, torch.Tensor]):
        _name_rows(self, gathered)

    def talker_params(self) -> WarpParams:
        return WarpParams(self.t_do_sample, self.t_temperature, self.t_top_k, self.t_top_p)

    def cp_params(self) -> WarpParams:
        return WarpParams(self.cp_do_sample, self.cp_temperature, self.cp_top_k, self.cp_top_p)
