"""Response-format encoders (voxflow/audio/encode.py, speed.py): everything is decoded back with PyAV.

Expected decoded durations (n input samples, rate r = output rate):
- pcm, wav, flac: exactly n (lossless, s16).
- opus: n * 48000 / r within 1 sample: the OpusHead pre-skip trims the encoder delay and the last page's granule
  position trims the padding; the only slack is the 22.05 -> 48 kHz resampling rounding.
- mp3, whole file: n, up to one frame (576) more: the Xing/LAME "Info" frame carries delay and padding.
- mp3, streamed: no Info frame (it is written at the end, into the start of the file), so decoders keep LAME's
  encoder delay + the decoder delay (576 + 529 = 1105 samples) and the padding to whole 576-sample frames
  (LAME may flush one frame more): n + [1105, 1105 + 2 * 576).
- aac (ADTS, streamed or not): ADTS cannot signal the 1024-sample priming or the end padding: n + [1024, 2048).
"""
from __future__ import annotations

import io
import math
import struct
import wave

import av
import numpy as np
import pytest

from voxflow.audio.encode import (BIT_RATES, FORMATS, OPUS_RATE, content_type, encode_all, make_encoder, ogg_crc,
                                  wav_header)
from voxflow.audio.io import to_pcm16
from voxflow.audio.speed import SPEED_MAX, SPEED_MIN, atempo_stages, check_speed

RATES = (24000, 22050)
CHUNKS = (1920, 7, 48000)  # then the rest


def speechlike(n: int, sr: int, seed: int = 0) -> np.ndarray:
    """Voiced-speech-like test audio: a gliding 100-250 Hz fundamental with harmonics, syllable-rate envelope,
    a little noise. Aperiodic enough that a cross-correlation has one clear peak."""
    t = np.arange(n) / sr
    f0 = 150 + 100 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    x = x + 0.05 * np.random.default_rng(seed).standard_normal(n)
    return (0.3 * x / np.max(np.abs(x))).astype(np.float32)


def sine(n: int, sr: int, freq: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(n) / sr)).astype(np.float32)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a whole file with PyAV to float32 mono, and its sample rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono")
        out, sr = [], stream.codec_context.sample_rate
        for frame in container.decode(stream):
            for f in resampler.resample(frame):
                out.append(f.to_ndarray().reshape(-1))
        for f in resampler.resample(None):
            out.append(f.to_ndarray().reshape(-1))
    return (np.concatenate(out) if out else np.zeros(0, np.float32)), sr


def decode_s16(data: bytes) -> np.ndarray:
    """Decode a lossless file to its s16 samples (no float round trip)."""
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="s16", layout="mono")
        out = []
        for frame in container.decode(container.streams.audio[0]):
            out += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
        out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out) if out else np.zeros(0, np.int16)


def decodable_samples(prefix: bytes) -> int:
    try:
        return len(decode(prefix)[0])
    except av.error.FFmpegError:  # too little to probe yet
        return 0


def stream_encode(fmt: str, x: np.ndarray, sr: int, chunks=CHUNKS, **kw) -> tuple[bytes, list[bytes]]:
    enc = make_encoder(fmt, sr, **kw)
    parts, pos = [], 0
    for size in list(chunks) + [len(x)]:
        parts.append(enc.feed(x[pos:pos + size]))
        pos += size
    parts.append(enc.finish())
    return b"".join(parts), parts


def best_lag_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 3000) -> tuple[int, float]:
    """The lag (a delayed by `lag` vs b) with the highest cross-correlation, and the normalised correlation."""
    size = 2 * max(len(a), len(b))
    cc = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)
    lags = np.r_[0:max_lag + 1, -max_lag:0]
    lag = int(lags[np.argmax(cc[lags])])
    a2, b2 = (a[lag:], b) if lag >= 0 else (a, b[-lag:])
    m = min(len(a2), len(b2))
    a2, b2 = a2[:m].astype(np.float64), b2[:m].astype(np.float64)
    return lag, float(np.dot(a2, b2) / math.sqrt(np.dot(a2, a2) * np.dot(b2, b2)))


def dominant_frequency(y: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    return float(np.argmax(spectrum) * sr / len(y))


def check_duration(fmt: str, streamed: bool, got: int, n: int, sr: int, out_sr: int) -> None:
    if fmt in ("pcm", "wav", "flac"):
        assert got == n
    elif fmt == "opus":
        assert abs(got - n * out_sr / sr) <= 1
    elif fmt == "mp3" and not streamed:
        assert 0 <= got - n < 576, got - n
    elif fmt == "mp3":
        assert 1105 <= got - n < 1105 + 2 * 576, got - n
    elif fmt == "aac":
        assert 1024 <= got - n < 2048, got - n
    else:
        raise AssertionError(fmt)


# ------------------------------------------------------------------------------------------------ formats


def test_formats_and_content_types():
    assert FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm")
    assert {f: content_type(f) for f in FORMATS} == {
        "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav",
        "pcm": "audio/pcm"}
    assert content_type("MP3") == "audio/mpeg"
    with pytest.raises(ValueError):
        content_type("ogg")
    with pytest.raises(ValueError):
        make_encoder("vorbis", 24000)
    with pytest.raises(ValueError):
        make_encoder("wav", 0)


@pytest.mark.parametrize("sr", RATES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_streamed_and_whole_decode_back(fmt, sr):
    n = 2 * sr + 123
    x = speechlike(n, sr)
    streamed, parts = stream_encode(fmt, x, sr)
    whole = encode_all(fmt, x, sr)
    expected_sr = OPUS_RATE if fmt == "opus" else sr
    assert make_encoder(fmt, sr).output_sample_rate == expected_sr

    if fmt == "pcm":
        ref = to_pcm16(x).astype("<i2").tobytes()
        assert streamed == ref and whole == ref  # bit-exact s16le, no header
        assert parts[0] == ref[:2 * CHUNKS[0]]  # pcm leaves at once
        return

    ys, srs = decode(streamed)
    yw, srw = decode(whole)
    assert srs == srw == expected_sr
    check_duration(fmt, True, len(ys), n, sr, expected_sr)
    check_duration(fmt, False, len(yw), n, sr, expected_sr)

    if fmt in ("wav", "flac"):
        ref = to_pcm16(x)
        assert np.array_equal(decode_s16(streamed), ref)
        assert np.array_equal(decode_s16(whole), ref)
    else:
        # Same audio up to the codec delay the streamed file cannot signal (mp3: 1105 samples).
        lag, corr = best_lag_correlation(ys, yw)
        assert corr > 0.99, (lag, corr)
        assert lag == (1105 if fmt == "mp3" else 0)
        # ... and it is the input (aac keeps its 1024-sample priming).
        ref = x if expected_sr == sr else np.interp(np.arange(len(yw)) * sr / expected_sr, np.arange(n), x)
        lag, corr = best_lag_correlation(yw, ref.astype(np.float32))
        assert corr > 0.98, (lag, corr)
        assert lag == (1024 if fmt == "aac" else 0)


def test_wav_headers():
    sr, n = 24000, 5000
    x = sine(n, sr)
    _, parts = stream_encode("wav", x, sr, chunks=(1920, 7))
    head = parts[0][:44]
    assert head == wav_header(sr)
    riff, riff_size, wave_, fmt_, fmt_size, tag, ch, rate, byte_rate, align, bits, data, data_size = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", head)
    assert (riff, wave_, fmt_, data) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert riff_size == data_size == 0xFFFFFFFF
    assert (fmt_size, tag, ch, rate, byte_rate, align, bits) == (16, 1, 1, sr, 2 * sr, 2, 16)
    assert len(parts[0]) == 44 + 2 * 1920  # header + the first samples at once
    assert all(not p.startswith(b"RIFF") for p in parts[1:])

    whole = encode_all("wav", x, sr)
    assert struct.unpack_from("<I", whole, 4)[0] == 36 + 2 * n
    assert struct.unpack_from("<I", whole, 40)[0] == 2 * n
    with wave.open(io.BytesIO(whole)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, sr, n)
        assert np.array_equal(np.frombuffer(w.readframes(n), "<i2"), to_pcm16(x))


def test_not_streamed_wav_and_lossy_feed_returns_nothing_until_finish():
    enc = make_encoder("wav", 24000, streaming=False)
    assert enc.feed(sine(2400, 24000)) == b""
    assert enc.finish()[:4] == b"RIFF"
    enc = make_encoder("mp3", 24000, streaming=False)
    assert enc.feed(sine(24000, 24000)) == b""
    assert len(enc.finish()) > 1000


@pytest.mark.parametrize("fmt", ["mp3", "aac", "flac", "opus"])
def test_streaming_compressed_formats_send_audio_early(fmt):
    """Fed 80 ms at a time, decodable audio has left after <= 0.5 s fed, and bytes keep flowing."""
    sr = 24000
    x = speechlike(2 * sr, sr)
    enc = make_encoder(fmt, sr)
    step = sr * 80 // 1000
    sent, first_audio_at, nonempty = b"", None, 0
    for pos in range(0, len(x), step):
        part = enc.feed(x[pos:pos + step])
        nonempty += bool(part)
        sent += part
        if first_audio_at is None and part and decodable_samples(sent) > 0:
            first_audio_at = pos + step
    tail = enc.finish()
    # Measured here: opus 80 ms, mp3 / aac / flac 160 ms (a lone first MP3 frame does not probe as MP3 yet).
    assert first_audio_at is not None and first_audio_at <= sr // 2, first_audio_at
    assert nonempty >= 10  # of 25 feeds
    assert len(tail) < len(sent)


def test_streamed_flac_drops_padding():
    sr = 24000
    x = speechlike(sr, sr)
    streamed, _ = stream_encode("flac", x, sr)
    blocks, pos = [], 4
    assert streamed[:4] == b"fLaC"
    while True:
        kind, size = streamed[pos] & 0x7F, int.from_bytes(streamed[pos + 1:pos + 4], "big")
        blocks.append(kind)
        pos += 4 + size
        if streamed[pos - 4 - size] & 0x80:
            break
    assert blocks[0] == 0 and 1 not in blocks  # STREAMINFO first, no PADDING
    # STREAMINFO says "total samples unknown" (0); PyAV/ffmpeg decode it fully. (libsndfile 1.2.2 reports
    # such a file as 2**63-1 frames and fails to read it to the end: not a client we can help here.)
    total_samples = lambda flac: int.from_bytes(flac[8 + 13:8 + 18], "big") & 0xFFFFFFFFF  # noqa: E731
    assert total_samples(streamed) == 0
    assert total_samples(encode_all("flac", x, sr)) == len(x)  # a whole file has the real STREAMINFO
    assert np.array_equal(decode_s16(streamed), to_pcm16(x))


def test_ogg_opus_is_valid_for_libsndfile_and_crc_matches_reference():
    import soundfile as sf

    def crc_reference(data: bytes) -> int:
        crc = 0
        for byte in data:
            crc ^= byte << 24
            for _ in range(8):
                crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
                crc &= 0xFFFFFFFF
        return crc

    rng = np.random.default_rng(1)
    for size in (0, 1, 27, 300):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert ogg_crc(data) == crc_reference(data)

    sr, n = 22050, 22050 + 77
    streamed, _ = stream_encode("opus", speechlike(n, sr), sr)
    assert streamed[:4] == b"OggS" and b"OpusHead" in streamed[:64] and b"OpusTags" in streamed[:200]
    info = sf.info(io.BytesIO(streamed))
    assert (info.samplerate, info.channels, info.subtype) == (48000, 1, "OPUS")
    y, _ = sf.read(io.BytesIO(streamed))
    assert abs(len(y) - n * 48000 / sr) <= 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_audio_and_tiny_audio_still_make_decodable_files(fmt):
    for streaming in (True, False):
        for n in (0, 5):
            enc = make_encoder(fmt, 24000, streaming=streaming)
            data = enc.feed(np.full(n, 0.1, np.float32)) + enc.finish()
            if fmt == "pcm":
                assert len(data) == 2 * n
                continue
            y, _ = decode(data)
            if fmt in ("wav", "flac"):
                assert len(y) == n
            else:  # lossy formats cannot hold 0 samples: 10 ms of silence stands in, plus codec delay
                assert 0 < len(y) <= 48000 * 0.1


def test_encoder_lifecycle_and_input_shapes():
    enc = make_encoder("pcm", 24000)
    assert enc.feed(np.zeros((3, 1), np.float32)) == b"\0" * 6  # [n, 1] is mono too
    with pytest.raises(ValueError):
        enc.feed(np.zeros((3, 2), np.float32))
    assert enc.finish() == b""
    assert enc.finish() == b""  # idempotent
    with pytest.raises(RuntimeError):
        enc.feed(np.zeros(3, np.float32))
    for fmt in FORMATS:  # abandoning an encoder (client gone) is fine
        enc = make_encoder(fmt, 24000)
        enc.feed(sine(4800, 24000))
        enc.close()
        enc.close()
    assert set(BIT_RATES) == {"mp3", "aac", "opus"}


# -------------------------------------------------------------------------------------------------- speed


def test_speed_range_is_validated():
    assert check_speed(SPEED_MIN) == 0.25 and check_speed(SPEED_MAX) == 4.0
    for bad in (0.24, 4.01, 0, -1, float("nan"), float("inf"), "fast", None):
        with pytest.raises(ValueError):
            check_speed(bad)
    with pytest.raises(ValueError):
        make_encoder("mp3", 24000, speed=5)
    with pytest.raises(ValueError):
        encode_all("wav", np.zeros(10, np.float32), 24000, speed=0.2)


def test_atempo_stages_stay_in_range():
    for speed in (0.25, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 4.0):
        stages = atempo_stages(speed)
        assert all(0.5 <= s <= 2.0 for s in stages)
        assert math.isclose(math.prod(stages), speed)


def test_speed_one_is_bit_exact_passthrough():
    x = speechlike(12000, 24000)
    enc = make_encoder("pcm", 24000, speed=1.0)
    assert enc._tempo is None
    assert enc.feed(x) + enc.finish() == to_pcm16(x).astype("<i2").tobytes()


@pytest.mark.parametrize("speed", [2.0, 0.5, 4.0, 0.25])
def test_speed_changes_duration_not_pitch(speed):
    sr = 24000
    n = 2 * sr
    x = sine(n, sr)
    streamed, _ = stream_encode("wav", x, sr, speed=speed)
    whole = encode_all("wav", x, sr, speed=speed)
    assert streamed[44:] == whole[44:]  # fixed internal framing: chunking does not change the audio
    y, _ = decode(whole)
    assert abs(len(y) / (n / speed) - 1) <= 0.05, len(y) / (n / speed)
    assert abs(dominant_frequency(y, sr) - 440) <= 10


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_speed_works_for_compressed_formats_streamed(fmt):
    sr = 22050
    n = 2 * sr
    streamed, parts = stream_encode(fmt, sine(n, sr), sr, speed=2.0)
    y, out_sr = decode(streamed)
    expected = n / 2 * out_sr / sr
    codec_slack = {"mp3": 1105 + 2 * 576, "aac": 2048}.get(fmt, 0)  # see the module docstring
    assert 0.95 * expected <= len(y) <= 1.05 * expected + codec_slack, (len(y), expected)
    assert abs(dominant_frequency(y, out_sr) - 440) <= 10
    assert sum(len(p) for p in parts[:-1]) > 0  # tempo-changed audio streams too


def test_pcm16_convention_rounds_clips_and_silences_nan():
    """to_pcm16 (one convention for engines, encoders and files): round(x * 32768) half to even, clipped to int16;
    out-of-range samples clip, NaN is silence, +-inf full scale; the input is left as it was."""
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, np.nan, np.inf, -np.inf, 1.5 / 32768, 2.5 / 32768,
                  -1.5 / 32768], dtype=np.float32)
    before = x.copy()
    got = to_pcm16(x)
    assert got.dtype == np.int16
    assert got.tolist() == [0, 16384, -16384, 32767, -32768, 32767, -32768, 0, 32767, -32768, 2, 2, -2]
    assert np.array_equal(x, before, equal_nan=True)
    rng = np.random.default_rng(0)
    y = rng.uniform(-1.2, 1.2, 48000).astype(np.float32)
    want = np.clip(np.round(np.clip(y, -1.0, 1.0) * np.float32(32768.0)), -32768, 32767).astype(np.int16)
    assert np.array_equal(to_pcm16(y), want)
    # the edges of the rounding and of float32's range, NaN and infinities among them, in any order
    edges = np.array([32767.5 / 32768, -32768.5 / 32768, 0.5 / 32768, -0.5 / 32768, 1.00001, -1.00001, 3e38, -3e38,
                      np.nan, np.inf, -np.inf, -0.0], dtype=np.float32)
    z = rng.permutation(np.concatenate([edges, rng.standard_normal(4096).astype(np.float32) * 3]))
    plain = np.nan_to_num(z, nan=0.0, posinf=1.0, neginf=-1.0)
    want = np.clip(np.round(np.clip(plain, -1.0, 1.0) * np.float32(32768.0)), -32768, 32767).astype(np.int16)
    assert np.array_equal(to_pcm16(z), want)
    assert np.array_equal(to_pcm16(z.astype(np.float64)), want)        # float64 in: the same float32 convention
