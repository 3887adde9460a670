"""Reference-audio decoding against hostile files (voxflow.audio.io, voxflow.api.media).

- A 7.1 clip that only PyAV can read used to segfault the process: PyAV finds a planar frame's planes by scanning
  past its 8 data pointers, and to_ndarray() then read unmapped memory. The decode runs in a child process, so a
  crash shows as a failed test, not a dead pytest.
- A small, highly compressed clip of a long silence used to be decoded whole (gigabytes) before the duration check;
  decoding must stop at the limit (the samples it produced are counted, nothing is timed).
- A URL with a tab gave a 500 (httpx.InvalidURL is not an httpx.HTTPError); it must be a 400 before any connection.

Every file is generated here with PyAV / soundfile / numpy, a few kB each.
"""
import asyncio
import io
import json
import subprocess
import sys

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

from voxflow.api import media
from voxflow.api.errors import APIError
from voxflow.api.state import ServerSettings
from voxflow.audio import io as audio_io


def encode(path, codec, layout, data, *, sr=48000, fmt="matroska", sample_fmt="s16"):
    """`data` [samples, channels] (int16 for "s16", float32 for "flt") -> a file of `codec` in `fmt`. Frames are
    built packed (one plane): building a planar frame of 8 channels trips the same PyAV plane scan."""
    c = av.open(str(path), "w", format=fmt)
    s = c.add_stream(codec, rate=sr, layout=layout)
    n = s.codec_context.frame_size or 4608
    for pts in range(0, len(data) - n + 1, n):
        f = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[pts:pts + n]).reshape(1, -1), format=sample_fmt,
                                       layout=layout)
        f.sample_rate, f.pts = sr, pts
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode(None):
        c.mux(p)
    c.close()
    return path.read_bytes()


CHILD = r"""
import asyncio, json, sys
import numpy as np
from voxflow.api import media
from voxflow.api.errors import APIError
from voxflow.api.state import ServerSettings
from voxflow.audio.io import AudioReadError, read_audio
out = {}
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    try:
        x, sr = read_audio(data)
        np.save(path + ".npy", x)
        res = {"sr": sr, "n": int(x.shape[0])}
    except AudioReadError as e:
        res = {"error": str(e)}
    try:                                  # the API's decode: upload / ref_audio
        wav = asyncio.run(media.decode_ref_audio(data, ServerSettings(min_ref_audio_seconds=0.1), target_sr=24000))
        res["api"] = int(wav.shape[0])
    except APIError as e:
        res["api"] = [e.status, e.code, e.message]
    out[path] = res
print(json.dumps(out))
"""


def decode_in_child(*paths):
    """read_audio and media.decode_ref_audio on each file, in a child process: a crash is a failure here."""
    p = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"decoder child died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_seven_one_clips_decode_to_the_channel_mean_without_crashing(tmp_path):
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((48000, 8)) * 3000).astype(np.int16)          # 1 s of 7.1
    flt = (rng.standard_normal((48000, 8)) * 0.1).astype(np.float32)
    files = {
        "flac": encode(tmp_path / "a.mka", "flac", "7.1", pcm),            # the audit's clip: s16 -> fltp
        "f32": encode(tmp_path / "b.mka", "pcm_f32le", "7.1", flt, sample_fmt="flt"),
        "aac": encode(tmp_path / "c.m4a", "aac", "7.1", flt, fmt="mp4", sample_fmt="flt"),  # decodes to fltp
    }
    with pytest.raises(Exception):
        sf.info(io.BytesIO(files["flac"]))                                   # libsndfile can't: PyAV decodes it
    paths = [tmp_path / "a.mka", tmp_path / "b.mka", tmp_path / "c.m4a"]
    res = decode_in_child(*paths)
    for path in paths:
        r = res[str(path)]
        assert r.get("sr") == 48000 and r["n"] > 0 and isinstance(r["api"], int), r
    n = res[str(paths[0])]["n"]
    lossless = {paths[0]: pcm.astype(np.float32) / 32768.0, paths[1]: flt}
    for path, raw in lossless.items():
        got = np.load(str(path) + ".npy")
        assert got.shape[0] == n <= raw.shape[0]
        np.testing.assert_allclose(got, raw[:n].mean(axis=1), atol=1e-6)   # every channel, none past the end


def test_more_than_eight_channels_are_refused_before_decoding(tmp_path, monkeypatch):
    twelve = np.zeros((4800, 12), dtype=np.int16)
    encode(tmp_path / "twelve.mka", "pcm_s16le", "12 channels", twelve)
    sf.write(tmp_path / "twelve.wav", twelve, 48000, subtype="PCM_16")
    res = decode_in_child(tmp_path / "twelve.mka", tmp_path / "twelve.wav")
    for r in res.values():
        assert "12 channels; at most 8" in r["error"], r
        status, code, message = r["api"]
        assert status == 400 and code == "invalid_audio" and "at most 8" in message

    class NoResampler:                                                       # refused from the header
        def __init__(self, *a, **k):
            raise AssertionError("decoding started")
    monkeypatch.setattr(av, "AudioResampler", NoResampler)
    with pytest.raises(audio_io.AudioReadError, match="12 channels"):
        audio_io.read_audio((tmp_path / "twelve.mka").read_bytes())


class Counting:
    """Counts what the decoders produce: samples out of PyAV's resampler, frames read through libsndfile."""

    def __init__(self, monkeypatch):
        self.samples = 0
        real_resampler, real_sf = av.AudioResampler, sf.SoundFile
        counter = self

        class Resampler:
            def __init__(self, *a, **k):
                self.inner = real_resampler(*a, **k)

            def resample(self, frame):
                out = self.inner.resample(frame)
                counter.samples += sum(f.samples for f in out)
                return out

        class SoundFile(real_sf):
            def read(self, *a, **k):
                out = super().read(*a, **k)
                counter.samples += len(out)
                return out
        monkeypatch.setattr(av, "AudioResampler", Resampler)
        monkeypatch.setattr(sf, "SoundFile", SoundFile)


def test_long_compressed_clip_is_refused_after_decoding_only_the_limit(tmp_path, monkeypatch):
    sr, limit = 16000, 5.0
    silence = np.zeros((60 * sr, 6), dtype=np.int16)                        # 60 s of 5.1: ~50 kB of FLAC
    data = encode(tmp_path / "long.mka", "flac", "5.1", silence, sr=sr)
    assert len(data) < 200_000
    counted = Counting(monkeypatch)
    settings = ServerSettings(max_ref_audio_seconds=limit)
    with pytest.raises(APIError) as info:
        asyncio.run(media.decode_ref_audio(data, settings, target_sr=24000))
    assert info.value.status == 400 and info.value.code == "audio_too_long"
    assert "longer than 5 s" in info.value.message
    # it stopped within a frame or two of the limit, not after the whole minute
    assert limit * sr < counted.samples <= limit * sr + 2 * 4608, counted.samples

    stored = ServerSettings(max_ref_audio_seconds=float("inf"))              # stored voices: no limit
    wav = asyncio.run(media.decode_ref_audio(data, stored, target_sr=sr))
    assert wav.shape[0] > 59 * sr


def test_flac_without_a_length_is_refused_at_the_limit(tmp_path, monkeypatch):
    """libsndfile's own path: a FLAC whose STREAMINFO total is 0 reads as SF_COUNT_MAX frames; it used to be
    read whole (or refused as "192153584101141 s long")."""
    sr = 8000
    buf = io.BytesIO()
    sf.write(buf, np.zeros((60 * sr, 2), dtype=np.int16), sr, format="FLAC", subtype="PCM_16")
    d = bytearray(buf.getvalue())
    assert d[:4] == b"fLaC"
    d[8 + 13] &= 0xF0                                                        # total samples: 36 bits, zeroed
    d[8 + 14:8 + 18] = b"\0\0\0\0"
    data = bytes(d)
    assert sf.info(io.BytesIO(data)).frames >= 2**62
    counted = Counting(monkeypatch)
    with pytest.raises(audio_io.AudioTooLongError, match="longer than 3 s"):
        audio_io.read_audio(data, max_seconds=3.0)
    assert counted.samples <= 3 * sr + 65536
    with pytest.raises(APIError) as info:
        asyncio.run(media.decode_ref_audio(data, ServerSettings(max_ref_audio_seconds=3.0), target_sr=24000))
    assert info.value.code == "audio_too_long" and "longer than 3 s" in info.value.message


def test_url_with_control_characters_is_a_400_before_any_connection(monkeypatch):
    class NoNetwork:
        def __init__(self, *a, **k):
            raise AssertionError("no connection may be made")
    monkeypatch.setattr(httpx, "AsyncClient", NoNetwork)
    settings = ServerSettings(allowed_media_domains=("allowed.test",))
    for url in ("http://evil.com\t@allowed.test/a.wav", "http://evil.com\n@allowed.test/a.wav",
                "https://allowed.test/a b.wav", "https://allowed.test\\@evil.com/a.wav"):
        with pytest.raises(APIError) as info:
            asyncio.run(media.load_ref_audio_bytes(url, settings))
        assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_url", "ref_audio"), url


def test_url_httpx_refuses_is_a_400(monkeypatch):
    """httpx.InvalidURL (not an httpx.HTTPError) raised by the client, here for a URL over httpx's 64 kB limit
    that passes our own checks, is a 400, not a 500 "internal error"."""
    def handler(request):
        raise AssertionError("no request may be sent")
    real_client = httpx.AsyncClient

    class Mocked(real_client):
        def __init__(self, *a, **k):
            super().__init__(*a, transport=httpx.MockTransport(handler), **k)
    monkeypatch.setattr(httpx, "AsyncClient", Mocked)
    settings = ServerSettings(allowed_media_domains=("allowed.test",))
    with pytest.raises(APIError) as info:
        asyncio.run(media.load_ref_audio_bytes("https://allowed.test/" + "a" * 70_000, settings))
    assert (info.value.status, info.value.code, info.value.message) == (400, "invalid_url",
                                                                        "ref_audio URL is malformed")


@pytest.mark.parametrize("sr", [24000, 44100])
def test_a_long_mp3_decodes_as_one_whole_read(tmp_path, sr):
    """libsndfile's MP3 decoder gives other samples after each block boundary of a blockwise read (~2,000 wrong
    samples every 65,536 frames): a 10 s MP3 read with a duration limit must equal one whole-file read, bit for
    bit, and be refused past the limit."""
    t = np.arange(10 * sr) / sr
    tone = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 0.5 * t)).astype(np.float32)
    path = tmp_path / "long.mp3"
    sf.write(path, tone, sr, format="MP3")
    data = path.read_bytes()
    whole, whole_sr = sf.read(io.BytesIO(data), dtype="float32")
    got, got_sr = audio_io.read_audio(data, max_seconds=30.0)
    assert got_sr == whole_sr == sr and got.shape == whole.shape and np.array_equal(got, whole)
    with pytest.raises(audio_io.AudioTooLongError):
        audio_io.read_audio(data, max_seconds=5.0)
