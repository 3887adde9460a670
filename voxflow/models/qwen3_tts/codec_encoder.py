"""Encoder half of the 12 Hz codec: 24 kHz audio -> 16 discrete codes per 80 ms frame.

The official tokenizer's encoder is transformers' Mimi model with its decoder half removed: a causal SEANet
convolution stack (24 kHz -> 25 Hz), an 8-layer causal transformer, a stride-2 convolution (-> 12.5 Hz) and a
split residual vector quantizer (1 semantic + 31 acoustic codebooks, of which the first 16 are kept).

Here only the encoder-side submodules are built, from transformers' own Mimi classes (so the numerics are
the library's), under the attribute names MimiModel uses. The state-dict keys are therefore the checkpoint's
`encoder.*` keys without the prefix, and the decoder half is never allocated.

Run this module in float32: the codes come from nearest-neighbour searches, and half precision flips some.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn
from transformers import MimiConfig
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiEncoder,
    MimiEuclideanCodebook,
    MimiSplitResidualVectorQuantizer,
    MimiTransformerModel,
)

from .config import CodecConfig


class CodecEncoder(nn.Module):
    """Qwen3-TTS-Tokenizer-12Hz encoder. `encode(wav)` -> LongTensor[frames, 16], frames = ceil(samples/1920)."""

    def __init__(self, config: CodecConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        mimi = MimiConfig(**config.encoder)
        # The official tokenizer loads Mimi with transformers' default attention for this model, SDPA.
        # Eager attention rounds differently and can flip a code near a decision boundary.
        mimi._attn_implementation = attn_implementation
        self.mimi_config = mimi
        self.sample_rate = int(config.input_sample_rate)
        self.downsample_rate = int(config.encode_downsample_rate)
        self.num_quantizers = int(config.encoder_valid_num_quantizers)
        if not mimi.num_semantic_quantizers <= self.num_quantizers <= mimi.num_quantizers:
            raise ValueError(f"codec encoder: encoder_valid_num_quantizers={self.num_quantizers} must lie in "
                             f"[{mimi.num_semantic_quantizers}, {mimi.num_quantizers}]")

        self.encoder = MimiEncoder(mimi)
        self.encoder_transformer = MimiTransformerModel(mimi)
        self.downsample = None
        rate_ratio = 1
        if mimi.frame_rate != mimi.encodec_frame_rate:
            # Same construction as MimiModel: a causal stride-2 conv whose causal padding repeats the edge.
            rate_ratio = int(mimi.encodec_frame_rate / mimi.frame_rate)
            self.downsample = MimiConv1d(mimi, mimi.hidden_size, mimi.hidden_size, kernel_size=2 * rate_ratio,
                                         stride=2, bias=False, pad_mode="replicate",
                                         layer_idx=len(self.encoder._mimiconv1d_layer_names))
        self.quantizer = MimiSplitResidualVectorQuantizer(mimi)

        hop = math.prod(mimi.upsampling_ratios) * (2 if self.downsample is not None else 1)
        if hop != self.downsample_rate:
            raise ValueError(f"codec encoder: the Mimi encoder hops {hop} samples per frame but the config says "
                             f"encode_downsample_rate={self.downsample_rate}")

    def num_frames(self, num_samples: int) -> int:
        """Frames kept for a clip of `num_samples` valid samples: ceil(num_samples / 1920)."""
        return -(-int(num_samples) // self.downsample_rate)

    def _forget_codebook_cache(self) -> None:
        # Mimi caches each codebook's centroids (embed_sum / cluster_usage) on first use. Weights loaded by
        # replacing buffers, or a move to another device, would leave that cache stale, so drop it per call;
        # recomputing it is cheap next to the encoder.
        for m in self.modules():
            if isinstance(m, MimiEuclideanCodebook):
                m._embed = None

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """Padded audio [B, 1, samples] -> codes [B, num_quantizers, frames] for the whole padded length."""
        self._forget_codebook_cache()
        h = self.encoder(audio)                                     # [B, hidden, 25 Hz frames]
        h = self.encoder_transformer(h.transpose(1, 2), use_cache=False, return_dict=True).last_hidden_state
        h = h.transpose(1, 2)
        if self.downsample is not None:
            h = self.downsample(h)                                  # [B, hidden, 12.5 Hz frames]
        codes = self.quantizer.encode(h, self.num_quantizers)      # [K, B, frames]
        return codes.transpose(0, 1)

    @torch.inference_mode()
    def encode_batch(self, wavs: Sequence[torch.Tensor | np.ndarray]) -> list[torch.Tensor]:
        """Encode several 24 kHz mono clips at once -> [LongTensor[frames_i, 16]], on this module's device.

        Like the official feature extractor, the clips are right-padded with zeros to the longest one and
        the padded batch is encoded without a mask; each clip then keeps its first ceil(len_i / 1920) frames.
        Everything is causal, so padding never reaches earlier frames, but a clip's last frame can differ
        from encoding it alone (the official batch behaves the same way).
        """
        if len(wavs) == 0:
            return []
        param = next(self.parameters())
        clips = []
        for i, w in enumerate(wavs):
            t = torch.as_tensor(w)
            if t.dim() != 1:
                raise ValueError(f"codec encoder: clip {i} must be 1-D mono audio, got shape {tuple(t.shape)}")
            if t.numel() == 0:
                raise ValueError(f"codec encoder: clip {i} is empty")
            clips.append(t)
        longest = max(c.numel() for c in clips)
        batch = torch.zeros(len(clips), 1, longest, dtype=param.dtype, device=param.device)
        for i, c in enumerate(clips):
            # float32 first: the official feature extractor hands the model float32 samples.
            batch[i, 0, : c.numel()] = c.to(torch.float32).to(device=param.device, dtype=param.dtype)
        codes = self(batch)
        return [codes[i, :, : self.num_frames(c.numel())].transpose(0, 1).contiguous()
                for i, c in enumerate(clips)]

    def encode(self, wav_24k: torch.Tensor | np.ndarray) -> torch.Tensor:
        """One 24 kHz mono clip [samples] -> LongTensor[ceil(samples/1920), 16]."""
        return self.encode_batch([wav_24k])[0]


__all__ = ["CodecEncoder"]
