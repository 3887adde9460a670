"""Piper voices (VITS in ONNX, via the optional `piper-tts` runtime): one-shot synthesis served by
`voxflow.engine.oneshot.OneShotCore`. Nothing here imports piper-tts until a voice is loaded.

    from voxflow.models.piper import load_voice
    voice = load_voice("piper:en_US-joe-medium", deterministic=True)
    pcm = voice.synthesize("Hello there.")          # float32 at voice.sample_rate (22050 Hz)

`engine_loader.load_core(config)` builds the engine core (models/registry.py calls it for `piper:` names).
"""
from .engine_loader import DEFAULT_VOICE, load_core, load_voice, resolve_voice
from .voice import PiperNotInstalledError, PiperVoiceModel, SynthOptions

__all__ = ["DEFAULT_VOICE", "PiperNotInstalledError", "PiperVoiceModel", "SynthOptions", "load_core",
           "load_voice", "resolve_voice"]
