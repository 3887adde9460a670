"""Model families by checkpoint type. The engine asks this registry for a model; it never imports a family.

Two kinds of family:
- autoregressive talker + codec (Qwen3-TTS, ...): `load(path, *, device, dtype, max_slots) -> (TTSModel,
  CodecModel)`, driven by the paged, continuously batched `EngineCore`; found from config.json's model_type;
- one-shot (non-autoregressive) voices (Piper): `load_core(config) -> an engine core` with EngineCore's interface
  (add_request / abort / step / has_work / stats / info / create_voice / shutdown); found from a `piper:` name, an
  `.onnx` voice file, or a folder holding one.
`build_engine(config)` picks the right one; the clients and the API only ever see the core interface.
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
# one-shot voices: "module:function" building a whole engine core from an EngineConfig
ONE_SHOT = {
    "piper": "voxflow.models.piper.engine_loader:load_core",
}


def _import(target: str):
    module_name, func = target.split(":")
    return getattr(importlib.import_module(module_name), func)


def is_one_shot(name_or_path: str) -> str | None:
    """The one-shot family serving this model name, or None."""
    if name_or_path.startswith("piper:") or name_or_path.endswith(".onnx"):
        return "piper"
    if os.path.isdir(name_or_path) and not os.path.exists(os.path.join(name_or_path, "config.json")) and any(
            f.endswith(".onnx") for f in os.listdir(name_or_path)):
        return "piper"
    return None


def build_engine(config):
    """An engine core (EngineCore or a one-shot core) for `config.model`."""
    family = is_one_shot(config.model)
    if family is not None:
        return _import(ONE_SHOT[family])(config)
    from ..engine.engine import EngineCore
    return EngineCore.from_config(config)


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


def load_for_engine(name_or_path: str, *, device: str = "cpu", dtype: str = "float32", max_slots: int = 32,
                    **options):
    """(talker-side TTSModel, CodecModel) for a model folder or hub id; `options` (e.g. codec_dtype,
    codec_cuda_graphs) go to the family's loader."""
    path = resolve_model_dir(name_or_path)
    return _import(FAMILIES[detect_family(path)])(path, device=device, dtype=dtype, max_slots=max_slots, **options)
