"""The Qwen3-TTS codec behind `voxflow.engine.model_api.CodecModel`: stateful streaming decode, batched.

Each request owns a `CodecStreamState` (codec_streaming.py: attention window, conv tails), so successive
calls concatenate to exactly one pass over all its frames. Requests that feed the same number of frames in
one call are decoded together: their states are concatenated, decoded in one `stream_decode`, split back.

Voice clone (ICL): `new_state(reference frames)` decodes the reference silently, so the generated audio starts
right after it, with the reference as context — what the official decode-then-cut does, minus its
proportional cut rounding (generate.decode_to_wav may keep one extra leading sample). Note the official
decode also restarts its context every 300 frames (300/25 windows); a stream never does, so beyond 300 frames
the two legitimately differ (the stream equals the single-pass decode).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from .codec_streaming import CodecStreamState, init_stream_state, stream_decode
from .model import Qwen3TTS


class Qwen3CodecRunner:
    def __init__(self, model: Qwen3TTS):
        self.decoder = model.codec_decoder
        self.sample_rate = model.sample_rate
        self.samples_per_frame = model.samples_per_frame
        self.device = next(self.decoder.parameters()).device

    @torch.no_grad()
    def new_state(self, prefix_frames: torch.Tensor | None) -> CodecStreamState:
        state = init_stream_state(self.decoder, 1)
        if prefix_frames is not None and prefix_frames.shape[0] > 0:
            _, state = stream_decode(self.decoder, self._codes([prefix_frames]), state)
        return state

    @torch.no_grad()
    def decode(self, states: list[CodecStreamState], frames: list[torch.Tensor]
               ) -> tuple[list[np.ndarray], list[CodecStreamState]]:
        if len(states) != len(frames):
            raise ValueError(f"{len(states)} states for {len(frames)} frame blocks")
        pcm: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(states)
        new_states = list(states)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, f in enumerate(frames):
            if f.shape[0] > 0:
                groups[int(f.shape[0])].append(i)
        for idx in groups.values():
            batch = CodecStreamState.cat([states[i] for i in idx]) if len(idx) > 1 else states[idx[0]]
            wav, batch = stream_decode(self.decoder, self._codes([frames[i] for i in idx]), batch)
            wav = wav[:, 0].float().cpu().numpy()
            for row, i in enumerate(idx):
                pcm[i] = wav[row]
                new_states[i] = batch.select([row]) if len(idx) > 1 else batch
        return pcm, new_states

    def _codes(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """[n, 16] blocks of equal n -> [B, 16, n] long on the decoder's device."""
        return torch.stack([b.to(device=self.device, dtype=torch.long) for b in blocks]).transpose(1, 2)
