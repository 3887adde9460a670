"""Qwen3-TTS as an engine model: the batched paged talker plugin and the streaming codec runner."""
from __future__ import annotations

import torch

from .codec_runner import Qwen3CodecRunner
from .model import Qwen3TTS
from .plugin import Qwen3TTSPlugin


def load(path: str, *, device: str = "cpu", dtype: str = "float32", max_slots: int = 32):
    model = Qwen3TTS.from_pretrained(path, device=device, dtype=getattr(torch, dtype))
    return Qwen3TTSPlugin(model, max_slots=max_slots), Qwen3CodecRunner(model)
