"""Reading, resampling and writing audio.

Reference audio for voice cloning arrives as a file path, raw bytes or an open file. It is decoded at full
precision (a float WAV stays float, an int16 WAV becomes int/32768 exactly as soundfile and librosa do),
averaged to mono and resampled with librosa's default resampler, because that is what the official
Qwen3-TTS code feeds to its speaker encoder and codec encoder; any other resampler changes the x-vector and
the reference codes.

Output audio is written as 16-bit PCM WAV.
"""
from __future__ import annotations

import io
import itertools
import math
import os
from typing import BinaryIO, Union

import numpy as np

AudioSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]

# int16 full scale. Reading divides by 32768 (soundfile, librosa); writing multiplies by the same number so a
# write/read round trip changes a sample by at most half a step (one step at +1.0, which has to be clipped).
_INT16_SCALE = 32768.0


# Channel cap, checked from the header before decoding and again on every decoded frame. 8 (7.1) is the largest
# layout of the common formats (FLAC, Vorbis and Opus stop at 8, AAC at 7.1) and a voice reference is mono or
# stereo anyway; each channel multiplies the decode work per second that the duration limit admits.
MAX_CHANNELS = 8
# The highest sample rate in ordinary use ("hi-res" 384 kHz). The duration limit is counted in samples at the
# file's own rate, so an absurd declared rate would stretch it (and the memory it allows) without bound.
MAX_SAMPLE_RATE = 384_000


class AudioReadError(ValueError):
    """The input could not be decoded as audio, or decoded to nothing usable."""


class AudioTooLongError(AudioReadError):
    """Decoding passed `max_seconds` and was stopped there (the true length is not known)."""

    def __init__(self, max_seconds: float):
        self.max_seconds = float(max_seconds)
        super().__init__(f"audio is longer than {max_seconds:g} s (decoding stopped there)")


def read_audio(source: AudioSource, *, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode `source` to `(samples, sample_rate)`: 1-D float32 mono at the file's own rate.

    soundfile (libsndfile: WAV, FLAC, OGG, MP3, ...) is tried first; anything it cannot open (m4a, aac, webm,
    ...) is decoded with PyAV. Multi-channel audio is averaged to mono (PyAV's frame by frame). With
    `max_seconds` (None or inf: no limit), decoding stops with `AudioTooLongError` as soon as more than
    `max_seconds * sample_rate` samples came out, so a small, highly compressed file cannot make this decode
    (and hold) more than the limit. More than MAX_CHANNELS channels or a rate above MAX_SAMPLE_RATE is refused.
    """
    name, payload = _prepare_source(source)
    errors = []
    try:
        samples, sr = _read_with_soundfile(payload, max_seconds)
    except AudioReadError:  # too long / too many channels: a verdict on the audio, not on the format
        raise
    except Exception as e:  # libsndfile reports unknown formats with several exception types
        errors.append(f"soundfile: {e}")
        try:
            samples, sr = _read_with_pyav(payload, max_seconds)
        except AudioReadError:
            raise
        except Exception as e2:
            errors.append(f"pyav: {e2}")
            raise AudioReadError(f"cannot decode audio from {name} ({'; '.join(errors)})") from None
    return _finish(samples, sr, name)


def _prepare_source(source: AudioSource) -> tuple[str, object]:
    """A human-readable name for errors, and something both decoders can open more than once."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise AudioReadError(f"no such audio file: {path!r}")
        return repr(path), path
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "read"):
        # Read the stream once into memory: the fallback decoder needs to start from the beginning again,
        # and not every stream can seek.
        data = source.read()
        if isinstance(data, str):
            raise AudioReadError("audio file object must be opened in binary mode")
    else:
        raise AudioReadError(f"unsupported audio source type: {type(source).__name__}")
    if len(data) == 0:
        raise AudioReadError("audio input is empty (0 bytes)")
    return f"<{len(data)} bytes>", data


def _open(payload):
    return io.BytesIO(payload) if isinstance(payload, bytes) else payload


def _check_shape(channels: int, sr: int) -> None:
    if channels > MAX_CHANNELS:
        raise AudioReadError(f"audio has {channels} channels; at most {MAX_CHANNELS} are supported")
    if sr > MAX_SAMPLE_RATE:
        raise AudioReadError(f"audio sample rate {sr} Hz is above the supported {MAX_SAMPLE_RATE} Hz")


def _frame_cap(max_seconds: float | None, sr: int) -> int | None:
    """The most samples per channel allowed at `sr`; more means longer than `max_seconds`."""
    if max_seconds is None or not math.isfinite(max_seconds):
        return None
    return int(max_seconds * sr)


def _read_with_soundfile(payload, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    import soundfile as sf

    # float32, like the official loaders (librosa.load / sf.read(dtype="float32")); a float file keeps its values.
    # One read of at most cap + 1 frames, not blocks: libsndfile's MP3 decoder gives other samples after each block
    # boundary of a blockwise read (~2,000 wrong samples every 65,536 frames, libsndfile 1.2.2); and not an
    # unbounded read: the header's frame count may be absent (FLAC: SF_COUNT_MAX) or a lie.
    with sf.SoundFile(_open(payload)) as f:
        sr = int(f.samplerate)
        _check_shape(int(f.channels), sr)
        cap = _frame_cap(max_seconds, sr)
        f.seek(0)       # as sf.read does: libsndfile's MP3 samples differ by an ulp without it (decoder state)
        data = f.read(-1 if cap is None else cap + 1, dtype="float32", always_2d=True)
        if cap is not None and len(data) > cap:
            raise AudioTooLongError(max_seconds)
    return to_mono(data), sr


def _read_with_pyav(payload, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    import av

    with av.open(_open(payload), mode="r") as container:
        stream = next((s for s in container.streams if s.type == "audio"), None)
        if stream is None:
            raise ValueError("no audio stream")
        _check_shape(int(stream.codec_context.channels or 0), int(stream.codec_context.sample_rate or 0))
        # Every frame becomes packed float32 ("flt": one interleaved plane) at its own rate and layout, and only
        # such frames are turned into arrays. PyAV counts a frame's planes by scanning extended_data for a NULL
        # pointer; for a planar frame of 8+ channels that scan runs past the pointer array (7.1 fltp: 9
        # "planes") and to_ndarray() reads unmapped memory: a segfault. A packed frame always has one plane.
        resampler = av.AudioResampler(format="flt")
        chunks, sr, cap, n = [], None, None, 0
        # (the final None flushes what the resampler still holds)
        for frame in itertools.chain(container.decode(stream), [None]):
            if frame is not None:
                _check_shape(frame.layout.nb_channels, frame.sample_rate)
                if sr is None:
                    if frame.sample_rate <= 0:      # the cap below would mean nothing
                        raise ValueError(f"invalid sample rate {frame.sample_rate}")
                    sr, cap = frame.sample_rate, _frame_cap(max_seconds, frame.sample_rate)
            n += _take_packed(resampler.resample(frame), sr, chunks)
            if cap is not None and n > cap:
                raise AudioTooLongError(max_seconds)
    if not chunks or sr is None:
        raise ValueError("no audio frames decoded")
    return np.concatenate(chunks), int(sr)


def _take_packed(frames, sr, chunks: list) -> int:
    """Append each packed-float frame as mono to `chunks`; the samples per channel taken."""
    taken = 0
    for out in frames:
        # The resampler passes through a frame already in "flt", and then checks nothing on later frames:
        # refuse anything else rather than call to_ndarray() on it.
        if out.format.name != "flt" or out.sample_rate != sr:
            raise ValueError(f"audio format changed mid-stream ({out.format.name}, {out.sample_rate} Hz)")
        channels = out.layout.nb_channels
        _check_shape(channels, out.sample_rate)
        chunks.append(to_mono(out.to_ndarray().reshape(-1, channels)))
        taken += out.samples
    return taken


def _finish(samples: np.ndarray, sr: int, name: str) -> tuple[np.ndarray, int]:
    if samples.ndim == 2:       # (an in-memory [samples, channels] array; the decoders return mono already)
        samples = to_mono(samples)
    if samples.size == 0:
        raise AudioReadError(f"audio from {name} contains no samples")
    if sr <= 0:
        raise AudioReadError(f"audio from {name} has an invalid sample rate {sr}")
    if not np.isfinite(samples).all():
        raise AudioReadError(f"audio from {name} contains NaN or infinite samples")
    return samples.astype(np.float32, copy=False), sr


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[samples, channels] -> [samples], the plain channel average (as librosa and the official code do)."""
    samples = np.asarray(samples)
    if samples.ndim == 1:
        return samples.astype(np.float32, copy=False)
    if samples.ndim != 2:
        raise ValueError(f"expected audio of shape [samples] or [samples, channels], got {samples.shape}")
    if samples.shape[1] == 1:
        return np.ascontiguousarray(samples[:, 0], dtype=np.float32)
    return np.mean(samples.astype(np.float32, copy=False), axis=1).astype(np.float32, copy=False)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample 1-D float audio with `librosa.resample` at its defaults (soxr "high quality"), in float32.

    Identical to the official Qwen3-TTS code, which calls
    `librosa.resample(y=wav.astype(np.float32), orig_sr=sr, target_sr=24000)` and skips equal rates.
    """
    sr_in, sr_out = int(sr_in), int(sr_out)
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"sample rates must be positive, got {sr_in} -> {sr_out}")
    wav = np.asarray(wav, dtype=np.float32)
    if sr_in == sr_out:
        return wav
    import librosa

    return librosa.resample(y=wav, orig_sr=sr_in, target_sr=sr_out).astype(np.float32, copy=False)


def load_reference_audio(source: AudioSource | tuple[np.ndarray, int], target_sr: int = 24000) -> np.ndarray:
    """Decode (or take an `(array, sample_rate)` pair), average to mono, resample to `target_sr`: float32 1-D."""
    if isinstance(source, tuple):
        if len(source) != 2:
            raise AudioReadError("an in-memory reference must be an (array, sample_rate) pair")
        samples, sr = np.asarray(source[0], dtype=np.float32), int(source[1])
        samples, sr = _finish(samples, sr, "the given array")
    else:
        samples, sr = read_audio(source)
    return resample(samples, sr, target_sr)


def _as_numpy(wav) -> np.ndarray:
    if hasattr(wav, "detach"):  # a torch tensor, possibly on an accelerator
        wav = wav.detach().to("cpu").float().numpy()
    return np.asarray(wav, dtype=np.float32)


def to_pcm16(wav) -> np.ndarray:
    """Float audio -> int16 samples: round(x * 32768) half to even, clipped to [-32768, 32767] (so x clipped to
    [-1, 1], +-inf full scale), NaN silence. Scaled first, clipped after rounding: the same samples as clipping to
    [-1, 1] first, in one float32 working copy and four passes, not nine (the API process converts every chunk of a
    pcm stream, the engine thread every chunk of an s16 one: 48,000 samples 73 -> 27 us on the development CPU)."""
    with np.errstate(over="ignore"):                    # (a finite sample past 1e34 scales to inf: full scale)
        x = np.multiply(_as_numpy(wav), np.float32(_INT16_SCALE), dtype=np.float32)
    np.rint(x, out=x)
    np.clip(x, -32768, 32767, out=x)
    nan = np.isnan(x)
    if nan.any():
        x[nan] = 0.0
    return x.astype(np.int16)


def pcm_bytes(pcm, fmt: str) -> bytes:
    """Mono float PCM as little-endian bytes: "f32" as is, "s16" through `to_pcm16` (the one int16 convention
    of voxflow: engines, HTTP encoders and files all agree sample for sample)."""
    if fmt == "s16":
        return to_pcm16(pcm).astype("<i2", copy=False).tobytes()
    if fmt == "f32":
        return np.asarray(pcm, dtype="<f4").tobytes()
    raise ValueError(f"unknown PCM format {fmt!r} (expected 'f32' or 's16')")


def pcm_from_bytes(data: bytes, fmt: str) -> np.ndarray:
    """Inverse of `pcm_bytes` (float32 out)."""
    if fmt == "s16":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / _INT16_SCALE
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def write_wav(dest: Union[str, os.PathLike, BinaryIO], wav, sample_rate: int) -> None:
    """Write mono `[samples]` (or `[samples, channels]`) float audio as a 16-bit PCM WAV file."""
    import soundfile as sf

    pcm = to_pcm16(wav)
    if pcm.ndim not in (1, 2):
        raise ValueError(f"expected audio of shape [samples] or [samples, channels], got {pcm.shape}")
    sf.write(dest, pcm, int(sample_rate), subtype="PCM_16", format="WAV")


def wav_bytes(wav, sample_rate: int) -> bytes:
    """The bytes of a 16-bit PCM WAV file holding `wav`."""
    buf = io.BytesIO()
    write_wav(buf, wav, sample_rate)
    return buf.getvalue()


__all__ = ["AudioReadError", "AudioTooLongError", "read_audio", "to_mono", "resample", "load_reference_audio",
           "to_pcm16", "write_wav", "wav_bytes"]
