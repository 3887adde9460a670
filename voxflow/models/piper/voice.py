"""A Piper voice (VITS exported to ONNX) as a one-shot model for `voxflow.engine.oneshot.OneShotCore`.

    voice = PiperVoiceModel.load("/path/en_US-joe-medium.onnx")     # + .onnx.json beside it
    pcm = voice.synthesize("Hello there.", deterministic=True)         # float32, voice.sample_rate (22050)

The runtime is the `piper-tts` package (GPL-3.0-or-later, optional extra `voxflow[piper]`): it is imported
lazily, only here, and used through its public API (PiperVoice.phonemize / phonemes_to_ids /
phoneme_ids_to_audio); nothing of it is copied.

Text -> units: piper's espeak-ng phonemizer splits the text into sentences; each sentence is one synthesis
unit (one ONNX run, one streamed chunk). A sentence longer than `max_unit_phonemes` phonemes is cut at its
last clause boundary (", ; :") before the limit, else at the last word boundary, else hard, so that one step
(and the memory of one run) stays bounded. The cut depends only on the text, never on load or stream mode.

Waveform per unit: `phoneme_ids_to_audio`, then what piper's own `PiperVoice.synthesize` does to each sentence
(peak-normalised to 1.0, clipped to [-1, 1], float32). With no long-sentence cuts, the concatenated units are
exactly piper's `synthesize(text)` chunks concatenated (sentence_silence 0), which the tests check.

Randomness (noise_scale / noise_w_scale; the voice's defaults are 0.667 / 0.8):
- deterministic (both 0): the same text gives the same samples on every run. Chosen per request when
  `sampling.greedy`, `sampling.temperature == 0` or a `sampling.seed` is given (onnxruntime cannot seed the
  model's random ops per run, so a seed buys reproducibility by turning noise off: different seeds then give
  the same audio), or for every request when the voice is loaded with `deterministic=True`;
- otherwise the voice's noise scales, each multiplied by `sampling.temperature` when given (1.0 = defaults):
  duration and samples change per run.

Speed: `length_scale` (phoneme duration; the voice's default, usually 1.0) divided by the request's speed.
SpeechRequest has no speed field today: the API applies `speed` in its encoder (atempo). `prepare` honours a
`speed` attribute if one is ever added to SpeechRequest; `synthesize(..., speed=)` and `load(length_scale=)`
use it directly.

Batching: the ONNX graph takes a padded [batch, phonemes] input, but it returns no per-item lengths (this
export has no duration output), padded items get a non-silent tail (|x| up to 0.03) and their samples differ
from an unbatched run (~1e-4); measured on 2 CPU cores, 4 sentences batched took as long as 4 runs in a row
(2.53 s vs 2.51 s). So `synthesize_batch` runs its items one after another: each item's audio is independent
of the batch it ran in, and the core interleaves requests sentence by sentence.
Not used: `sampling.max_new_tokens`, `ignore_eos`, `instructions` (dropped, as Qwen3-TTS 0.6B drops them;
`supports_instructions` is False), `non_streaming_mode`.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine.oneshot import OneShotPlan
from ...engine.request import SpeechRequest
from ..hub import ModelNotFoundError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install voxflow[piper]"
TASK = "custom_voice"       # a preset voice, no cloning, no design: voxflow's custom_voice task
_CLAUSE_END = (",", ";", ":")


def import_piper():
    """The piper-tts runtime module, or PiperNotInstalledError."""
    try:
        import piper
    except ImportError as e:
        raise PiperNotInstalledError(f"Piper voices need the optional 'piper' extra ({e}): {INSTALL_HINT}") from None
    return piper


class PiperNotInstalledError(ModelNotFoundError, ImportError):
    """piper-tts (or a bundled voice package) is missing. Both a ModelNotFoundError (the CLI prints it as a usage
    error) and an ImportError."""


@dataclass(frozen=True)
class SynthOptions:
    """Per-request synthesis options (passed back with every unit)."""
    noise_scale: float
    noise_w_scale: float
    length_scale: float
    speaker_id: int | None = None

    @property
    def deterministic(self) -> bool:
        return self.noise_scale == 0.0 and self.noise_w_scale == 0.0


class PiperVoiceModel:
    family = "piper"

    def __init__(self, voice: Any, *, name: str, config: dict | None = None, deterministic: bool = False,
                 length_scale: float | None = None, max_unit_phonemes: int = 250):
        """voice: a loaded `piper.PiperVoice`; config: its .onnx.json as a dict (language and dataset names)."""
        self.voice = voice
        self.name = name
        self.raw_config = config or {}
        self.deterministic = bool(deterministic)
        pc = voice.config
        self.sample_rate = int(pc.sample_rate)
        self.default_noise_scale = float(pc.noise_scale)
        self.default_noise_w_scale = float(pc.noise_w_scale)
        self.length_scale = float(length_scale if length_scale is not None else pc.length_scale)
        if max_unit_phonemes < 8:
            raise ValueError("max_unit_phonemes must be >= 8")
        self.max_unit_phonemes = int(max_unit_phonemes)
        if pc.num_speakers > 1 and pc.speaker_id_map:
            self.speakers = dict(pc.speaker_id_map)
        else:
            self.speakers = {str(self.raw_config.get("dataset") or "default"): None}
        lang = self.raw_config.get("language") or {}
        self.language = str(lang.get("name_english") or pc.espeak_voice).lower()
        self._language_names = {s.lower() for s in (self.language, lang.get("code"), lang.get("family"),
                                                    pc.espeak_voice) if s}
        self._language_names |= {s.replace("_", "-") for s in self._language_names}

    @classmethod
    def load(cls, model_path: str, config_path: str | None = None, *, name: str | None = None,
             use_cuda: bool = False, threads: int | None = None, **kwargs) -> "PiperVoiceModel":
        """Load an ONNX voice (config: `<model>.json` unless given). threads: onnxruntime intra-op threads
        (None = onnxruntime's default, all physical cores). kwargs: deterministic, length_scale,
        max_unit_phonemes."""
        piper = import_piper()
        import onnxruntime

        model_path = str(model_path)
        config_path = str(config_path or model_path + ".json")
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
        providers = ["CPUExecutionProvider"]
        if use_cuda:
            if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
                providers = [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})] + providers
            else:
                log.warning("onnxruntime has no CUDA provider here: the Piper voice runs on the CPU")
        session = onnxruntime.InferenceSession(model_path, sess_options=options, providers=providers)
        voice = piper.PiperVoice(session=session, config=piper.PiperConfig.from_dict(raw))
        if name is None:
            name = os.path.basename(model_path)[:-len(".onnx")] if model_path.endswith(".onnx") else model_path
        return cls(voice, name=name, config=raw, **kwargs)

    # ---- what the API shows -----------------------------------------------------------------------------
    @property
    def voices(self) -> list[str]:
        return list(self.speakers)

    def describe(self) -> dict:
        return dict(name=self.name, family=self.family, task=TASK, sample_rate=self.sample_rate,
                    voices=self.voices, languages=[self.language], supports_instructions=False,
                    deterministic=self.deterministic)

    # ---- requests ---------------------------------------------------------------------------------------
    def options(self, *, deterministic: bool | None = None, temperature: float | None = None,
                speed: float | None = None, speaker_id: int | None = None) -> SynthOptions:
        det = self.deterministic if deterministic is None else deterministic
        if det or temperature == 0:
            noise, noise_w = 0.0, 0.0
        else:
            t = 1.0 if temperature is None else float(temperature)
            if not (t > 0 and np.isfinite(t)):
                raise ValueError(f"temperature must be a finite number >= 0, not {temperature}")
            noise, noise_w = self.default_noise_scale * t, self.default_noise_w_scale * t
        length = self.length_scale
        if speed is not None:
            if not (np.isfinite(speed) and speed > 0):
                raise ValueError(f"speed must be a positive number, not {speed}")
            length = length / float(speed)
        return SynthOptions(noise, noise_w, length, speaker_id)

    def _speaker_id(self, voice: str | None) -> int | None:
        if voice is None or not voice.strip():
            return None
        for name, sid in self.speakers.items():
            if name.lower() == voice.strip().lower():
                return sid
        raise ValueError(f"unknown voice {voice!r}; this Piper voice speaks as: {', '.join(self.voices)}")

    def prepare(self, request: SpeechRequest) -> OneShotPlan:
        """Validate a request and cut its text into units. ValueError for bad input."""
        if request.task not in (None, TASK):
            raise ValueError(f"Piper voices serve {TASK} requests (a preset voice), not {request.task}")
        if request.ref_audio is not None or request.voice_clone_prompt is not None:
            raise ValueError("Piper voices cannot clone a voice (no ref_audio / stored voices)")
        if request.language is not None and request.language.strip().lower() not in ("", "auto"):
            if request.language.strip().lower().replace("_", "-") not in self._language_names:
                raise ValueError(f"unsupported language {request.language!r}: this voice speaks {self.language}")
        if not isinstance(request.text, str) or not request.text.strip():
            raise ValueError("text is empty: give some text to speak")
        s = request.sampling
        options = self.options(deterministic=True if (s.greedy or s.seed is not None) else None,
                               temperature=s.temperature, speed=getattr(request, "speed", None),
                               speaker_id=self._speaker_id(request.voice))
        units = self.text_to_units(request.text)
        if not units:
            raise ValueError("the text has nothing to speak (no words after phonemization)")
        costs = [len(u) for u in units]
        return OneShotPlan(units=units, options=options, costs=costs, prompt_tokens=sum(costs))

    def text_to_units(self, text: str) -> list[list[int]]:
        """Phoneme-id lists, one per synthesis unit (sentence, or piece of an overlong sentence)."""
        units = []
        for sentence in self.voice.phonemize(text):
            if not any(p.isalpha() for p in sentence):
                continue            # punctuation only: nothing to say
            for piece in split_phonemes(sentence, self.max_unit_phonemes):
                units.append(list(self.voice.phonemes_to_ids(piece)))
        return units

    # ---- synthesis --------------------------------------------------------------------------------------
    def synthesize_batch(self, items: list[tuple[list[int], SynthOptions]]) -> list[np.ndarray]:
        """One waveform per (phoneme ids, options), run one after another (see the module docstring)."""
        return [self.unit_audio(ids, opts) for ids, opts in items]

    def unit_audio(self, phoneme_ids: list[int], options: SynthOptions) -> np.ndarray:
        piper = import_piper()
        syn = piper.SynthesisConfig(speaker_id=options.speaker_id, length_scale=options.length_scale,
                                    noise_scale=options.noise_scale, noise_w_scale=options.noise_w_scale)
        audio = np.asarray(self.voice.phoneme_ids_to_audio(phoneme_ids, syn), dtype=np.float32).reshape(-1)
        # as piper's PiperVoice.synthesize does per sentence: peak-normalise, clip, float32
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        audio = np.zeros_like(audio) if peak < 1e-8 else audio / peak
        return np.clip(audio, -1.0, 1.0).astype(np.float32)

    def synthesize(self, text: str, *, deterministic: bool | None = None, temperature: float | None = None,
                   speed: float | None = None, voice: str | None = None) -> np.ndarray:
        """The whole utterance as float32 PCM at `sample_rate` (units concatenated), without an engine."""
        opts = self.options(deterministic=deterministic, temperature=temperature, speed=speed,
                            speaker_id=self._speaker_id(voice))
        units = self.text_to_units(text)
        if not units:
            return np.zeros(0, np.float32)
        return np.concatenate(self.synthesize_batch([(u, opts) for u in units]))


def split_phonemes(phonemes: list[str], limit: int) -> list[list[str]]:
    """Cut a sentence's phonemes into pieces of at most `limit`: at the last clause boundary (", ; :") before the
    limit when there is one in its second half, else at the last space, else hard."""
    pieces = []
    rest = list(phonemes)
    while len(rest) > limit:
        cut = 0
        for i in range(limit - 1, limit // 2, -1):
            if rest[i] in _CLAUSE_END:
                cut = i + 1
                break
        if not cut:
            for i in range(limit - 1, 0, -1):
                if rest[i] == " ":
                    cut = i + 1
                    break
        if not cut:
            cut = limit
        piece, rest = rest[:cut], rest[cut:]
        while piece and piece[-1] == " ":
            piece.pop()
        while rest and rest[0] == " ":
            rest.pop(0)
        if piece:
            pieces.append(piece)
    if rest:
        pieces.append(rest)
    return pieces
