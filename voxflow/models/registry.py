"""Model families by checkpoint type. The engine asks this registry for a model; it never imports a family.

A family registers a loader `load(path, *, device, dtype, max_slots) -> (TTSModel, CodecModel)`, found from the
`model_type` in the checkpoint's config.json.
"""
from __future__ import annotations

import importlib
import json
import os

from .hub import ModelNotFoundError, resolve_model_dir

# model_type in config.json -> "module:function"
FAMILIES = {
    "qwen3_tts": "voxflow.models.qwen3_tts.engine_loader:load",
}


def detect_family(path: str) -> str:
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except FileNotFoundError:
        raise ModelNotFoundError(f"{path} has no config.json: not a model folder") from None
    if model_type not in FAMILIES:
        raise ModelNotFoundError(f"{path}: model_type '{model_type}' is not supported "
                                 f"(supported: {', '.join(sorted(FAMILIES))})")
    return model_type


def load_for_engine(name_or_path: str, *, device: str = "cpu", dtype: str = "float32", max_slots: int = 32):
    """(talker-side TTSModel, CodecModel) for a model folder or hub id."""
    path = resolve_model_dir(name_or_path)
    module_name, func = FAMILIES[detect_family(path)].split(":")
    return getattr(importlib.import_module(module_name), func)(path, device=device, dtype=dtype, max_slots=max_slots)
