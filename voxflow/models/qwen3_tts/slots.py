"""Persistent per-slot decode state of the Qwen3-TTS plugin: one row per slot in device tensors, so that a
decode step gathers its batch's rows and scatters them back with index ops (no per-request Python loop).

Per slot:
    c0            the pending codebook-0 code (sampled, its frame not yet completed)
    h             the talker hidden state that produced c0 (input of the code predictor)
    fed           frames completed and fed back so far (= index of the pending frame)
    prompt_len    P, so that the next talker position is P + fed
    trailing      [L, H] trailing-text rows (+ trailing_len); row k is added to frame k's input, tts_pad after
    history       [F, 16] the frames fed back (int16), for re-prefill after preemption
    seen          [V] bool: c0 ids generated so far (repetition penalty)
    sampling      do_sample / temperature / top_k / top_p for c0 (t_*) and codes 1..15 (cp_*), penalty,
                  min_new_tokens (huge when ignore_eos: EOS is then never drawn), key (seed_key), max_frames
The trailing and history buffers grow (at attach, never inside decode) to the longest request attached; a growth
reallocates them, which bumps `version` (CUDA graphs that captured the old buffers must be recaptured), so they
start large enough for real requests (256 trailing-text rows, 8192 frames).

Row `max_slots` is a scratch row that no request owns: padded batch rows (CUDA-graph buckets) read and write it.
"""
from __future__ import annotations

import torch

from .sampling import WarpParams

NEVER = 1 << 62      # min_new_tokens that is never reached (ignore_eos)


def _grow(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if t.shape[dim] >= size:
        return t
    shape = list(t.shape)
    shape[dim] = max(size, 2 * t.shape[dim])
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


class SlotTable:
    SNAPSHOT = ("c0", "h", "fed", "seen")

    def __init__(self, max_slots: int, hidden: int, vocab: int, num_groups: int, dtype: torch.dtype,
                 device: torch.device, trailing_cap: int = 256, history_cap: int = 8192):
        n = max_slots + 1           # + the scratch row
        self.version = 0
        z = dict(device=device)
        self.c0 = torch.zeros(n, dtype=torch.long, **z)
        self.h = torch.zeros(n, hidden, dtype=dtype, **z)
        self.fed = torch.zeros(n, dtype=torch.long, **z)
        self.prompt_len = torch.zeros(n, dtype=torch.long, **z)
        self.trailing = torch.zeros(n, trailing_cap, hidden, dtype=dtype, **z)
        self.trailing_len = torch.zeros(n, dtype=torch.long, **z)
        self.history = torch.zeros(n, history_cap, num_groups, dtype=torch.int16, **z)
        self.seen = torch.zeros(n, vocab, dtype=torch.bool, **z)
        self.t_do_sample = torch.zeros(n, dtype=torch.bool, **z)
        self.t_temperature = torch.ones(n, dtype=torch.float32, **z)
        self.t_top_k = torch.zeros(n, dtype=torch.long, **z)
        self.t_top_p = torch.ones(n, dtype=torch.float64, **z)
        self.cp_do_sample = torch.zeros(n, dtype=torch.bool, **z)
        self.cp_temperature = torch.ones(n, dtype=torch.float32, **z)
        self.cp_top_k = torch.zeros(n, dtype=torch.long, **z)
        self.cp_top_p = torch.ones(n, dtype=torch.float64, **z)
        self.penalty = torch.ones(n, dtype=torch.float32, **z)
        self.min_new_tokens = torch.zeros(n, dtype=torch.long, **z)
        self.key = torch.zeros(n, dtype=torch.long, **z)
        self.max_frames = torch.zeros(n, dtype=torch.long, **z)

    # ---- attach ------------------------------------------------------------------------------------
    def load(self, slot: int, *, params, key: int, prompt_len: int, max_frames: int, ignore_eos: bool,
             trailing: torch.Tensor) -> None:
        """Write a request's constant data (params: sampling.SamplingParams) and reset its counters."""
        grown = (_grow(self.trailing, 1, trailing.shape[0]), _grow(self.history, 1, max_frames))
        if grown[0] is not self.trailing or grown[1] is not self.history:
            self.trailing, self.history = grown
            self.version += 1
        self.trailing[slot, :trailing.shape[0]] = trailing.to(self.trailing)
        # fill_ on the slot's element, not `t[slot] = value`: item assignment copies the value in as a host
        # tensor, a blocking copy that waits for the decode step in flight (tests/gpu/test_gpu_no_host_sync.py).
        values = {
            "trailing_len": trailing.shape[0], "prompt_len": prompt_len, "max_frames": max_frames, "key": key,
            # Greedy rows get a neutral temperature, as WarpParams.build does, so their (unused) warp stays finite.
            "t_do_sample": params.do_sample, "t_temperature": params.temperature if params.do_sample else 1.0,
            "t_top_k": int(params.top_k), "t_top_p": params.top_p,
            "cp_do_sample": params.subtalker_do_sample,
            "cp_temperature": params.subtalker_temperature if params.subtalker_do_sample else 1.0,
            "cp_top_k": int(params.subtalker_top_k), "cp_top_p": params.subtalker_top_p,
            "penalty": params.repetition_penalty, "min_new_tokens": NEVER if ignore_eos else params.min_new_tokens,
            "c0": 0, "h": 0, "fed": 0, "seen": False,
        }
        for name, value in values.items():
            getattr(self, name)[slot].fill_(value)

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
    def talker_params(self, rows: torch.Tensor) -> WarpParams:
        return WarpParams(self.t_do_sample[rows], self.t_temperature[rows], self.t_top_k[rows], self.t_top_p[rows])

    def cp_params(self, rows: torch.Tensor) -> WarpParams:
        return WarpParams(self.cp_do_sample[rows], self.cp_temperature[rows], self.cp_top_k[rows],
                          self.cp_top_p[rows])

    def text_part(self, rows: torch.Tensor, frame: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """[B, H]: trailing-text row `frame` of each slot, or tts_pad once its queue is used up."""
        index = frame.clamp(max=self.trailing.shape[1] - 1)
        text = self.trailing[rows, index]
        return torch.where((frame < self.trailing_len[rows])[:, None], text, pad.to(text))

    def record_frame(self, rows: torch.Tensor, frame_index: torch.Tensor, frame: torch.Tensor) -> None:
        # Clamped: an engine that reads `finished` one step late may decode a finished slot once more.
        self.history[rows, frame_index.clamp(max=self.history.shape[1] - 1)] = frame.to(torch.int16)
