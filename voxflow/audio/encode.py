"""Response-format encoders for the speech API: incremental (streamed responses) and whole-file.

    enc = make_encoder("mp3", 24000, speed=1.0, streaming=True)
    for chunk in model_audio:            # float32 mono in [-1, 1] at the model's rate
        send(enc.feed(chunk))            # whatever encoded bytes are ready (may be b"")
    send(enc.finish())                   # the rest; the concatenation of all returns is a valid file

Formats (OpenAI `response_format`, MIME types as vLLM-Omni sends them):

- `pcm`  raw s16le mono at the model's rate, no header; bytes leave at every `feed`.
- `wav`  RIFF/WAVE PCM16 mono at the model's rate. Streamed: a 44-byte header with RIFF and data sizes
         0xFFFFFFFF (OpenAI's streaming WAV) goes out with the first `feed`, then raw samples. Not streamed:
         buffered and written at `finish` with the real sizes.
- `mp3`  libmp3lame CBR in a raw MP3 stream (ID3v2 tag first). At 24 / 22.05 kHz this is MPEG-2 layer III
         (576-sample frames), the standard for those rates. Not streamed, the file also carries a Xing/LAME
         "Info" frame with the encoder delay and padding, so decoders trim them (gapless); streamed it cannot
         (the frame is written at the end, into the start of the file).
- `opus` libopus in Ogg, always at 48 kHz (the model's audio is resampled). The Ogg pages are written here,
         not by ffmpeg's muxer, so that each `feed` ends a page and the audio encoded so far leaves at once
         (ffmpeg's muxer holds a page back, ~1 s by default); the last page's granule position trims the
         encoder's padding, the OpusHead pre-skip trims its delay: decoders return exactly the input duration.
- `aac`  ffmpeg's native AAC-LC in ADTS framing at the model's rate (1024-sample frames). ADTS cannot carry
         the 1024-sample encoder delay or the end padding, so decoders return up to ~2 frames more audio.
- `flac` FLAC, s16, at the model's rate: lossless, decodes to exactly the `pcm` samples. Streamed, the STREAMINFO
         block cannot be finished (total samples / MD5 unknown, 0) and the 8 KiB PADDING block ffmpeg reserves
         for rewriting it is dropped; not streamed, it carries the real values.

`speed` (0.25-4.0) changes the tempo without changing the pitch (ffmpeg `atempo`, see `speed.py`), incrementally,
also when streaming; 1.0 is a bit-exact pass-through.

With `streaming=False`, `feed` may return b"" and `finish` the rest: still concatenate every return.
Encoders are not thread-safe; use one per response. `close()` releases one that will not be finished
(client gone).
"""
from __future__ import annotations

import io
import struct
import zlib
from fractions import Fraction

import numpy as np

from .io import _as_numpy, to_pcm16
from .speed import Tempo, check_speed

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")

_CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# Bit rates of the lossy codecs (bits per second, mono). Module-level so a server can change them.
BIT_RATES = {"mp3": 96_000, "aac": 96_000, "opus": 64_000}

OPUS_RATE = 48_000  # Ogg Opus always carries 48 kHz granules; encode at that rate

_WAV_UNKNOWN = 0xFFFFFFFF


def content_type(fmt: str) -> str:
    """The MIME type of a `response_format`."""
    return _CONTENT_TYPES[_check_format(fmt)]


def _check_format(fmt) -> str:
    name = fmt.lower() if isinstance(fmt, str) else None
    if name not in _CONTENT_TYPES:
        raise ValueError(f"unsupported response_format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return name


def make_encoder(fmt: str, sample_rate: int, *, speed: float = 1.0, streaming: bool = True) -> "StreamEncoder":
    """An encoder of float32 mono audio at `sample_rate` into `fmt` (see the module docstring)."""
    fmt = _check_format(fmt)
    sample_rate = int(sample_rate)
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    speed = check_speed(speed)
    if fmt in ("pcm", "wav"):
        return _PcmEncoder(fmt, sample_rate, speed, streaming)
    if fmt == "opus":
        return _OggOpusEncoder(fmt, sample_rate, speed, streaming)
    return _ContainerEncoder(fmt, sample_rate, speed, streaming)


def encode_all(fmt: str, pcm, sample_rate: int, *, speed: float = 1.0) -> bytes:
    """The whole file: `pcm` (float32 mono at `sample_rate`) encoded as `fmt` for a non-streamed response."""
    enc = make_encoder(fmt, sample_rate, speed=speed, streaming=False)
    return enc.feed(pcm) + enc.finish()


class StreamEncoder:
    """Incremental encoder: `feed(pcm) -> bytes` as often as needed, then `finish() -> bytes` once.

    Attributes: `format`, `content_type`, `sample_rate` (of the input), `output_sample_rate` (of the encoded
    audio: the input rate except for opus, 48 kHz, and mp3/aac at a rate the codec lacks), `speed`,
    `streaming`, `finished`.
    """

    def __init__(self, fmt: str, sample_rate: int, speed: float, streaming: bool):
        self.format = fmt
        self.content_type = _CONTENT_TYPES[fmt]
        self.sample_rate = sample_rate
        self.output_sample_rate = sample_rate
        self.speed = speed
        self.streaming = bool(streaming)
        self.finished = False
        self._tempo = Tempo(sample_rate, speed) if speed != 1.0 else None

    def feed(self, pcm) -> bytes:
        """Encode more audio (float32 mono, [-1, 1]; torch tensors accepted); return the bytes ready now."""
        if self.finished:
            raise RuntimeError("feed() after finish()")
        x = _as_mono(pcm)
        if self._tempo is not None:
            x = self._tempo.process(_clean(x))
        return self._encode(x)

    def finish(self) -> bytes:
        """Flush everything still held; later calls return b""."""
        if self.finished:
            return b""
        self.finished = True
        out = b""
        if self._tempo is not None:
            out = self._encode(self._tempo.flush())
        return out + self._flush()

    def close(self) -> None:
        """Drop the encoder without producing the rest (e.g. the client went away). Idempotent."""
        self.finished = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # subclasses
    def _encode(self, x: np.ndarray) -> bytes:
        raise NotImplementedError

    def _flush(self) -> bytes:
        raise NotImplementedError


def _as_mono(pcm) -> np.ndarray:
    x = _as_numpy(pcm)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"expected mono audio of shape [samples], got shape {x.shape}")
    return x


def _silence(sample_rate: int) -> np.ndarray:
    """What the lossy formats encode when no audio was fed at all (they cannot represent zero samples)."""
    return np.zeros(max(1, sample_rate // 100), dtype=np.float32)


def _clean(x: np.ndarray) -> np.ndarray:
    """Float audio for the float paths: NaN -> 0, clipped to [-1, 1] as `to_pcm16` does."""
    x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(x, -1.0, 1.0).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------- pcm / wav


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """44-byte PCM16 mono WAV header; `data_bytes=None` writes 0xFFFFFFFF sizes (streaming)."""
    if data_bytes is None:
        riff_size = data_size = _WAV_UNKNOWN
    else:
        data_size = min(int(data_bytes), _WAV_UNKNOWN - 36)
        riff_size = 36 + data_size
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", riff_size, b"WAVE", b"fmt ", 16, 1, 1, sample_rate,
                       sample_rate * 2, 2, 16, b"data", data_size)


class _PcmEncoder(StreamEncoder):
    def __init__(self, fmt, sample_rate, speed, streaming):
        super().__init__(fmt, sample_rate, speed, streaming)
        self._header_sent = fmt != "wav"  # pcm has none
        self._buffer: list[bytes] = []  # wav, not streamed
        self._data_bytes = 0

    def _encode(self, x: np.ndarray) -> bytes:
        data = to_pcm16(x).astype("<i2", copy=False).tobytes()
        if self.format == "wav" and not self.streaming:
            self._buffer.append(data)
            self._data_bytes += len(data)
            return b""
        if not self._header_sent:
            self._header_sent = True
            return wav_header(self.sample_rate) + data
        return data

    def _flush(self) -> bytes:
        if self.format == "wav" and not self.streaming:
            data = b"".join(self._buffer)
            self._buffer = []
            return wav_header(self.sample_rate, len(data)) + data
        return self._encode(np.zeros(0, dtype=np.float32))  # the header, when nothing was fed


# ------------------------------------------------------------------------------------- mp3 / aac / flac


class _Sink:
    """Write-only, non-seekable file object: ffmpeg then writes nothing it would have to go back to."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts = []
        return out


class _FlacStreamHeader:
    """Drops the PADDING metadata blocks from the head of a streamed FLAC (ffmpeg reserves 8 KiB there to
    rewrite STREAMINFO at the end, which a stream cannot do) and passes everything after it through."""

    def __init__(self):
        self._head = b""
        self._done = False

    def __call__(self, data: bytes) -> bytes:
        if self._done:
            return data
        self._head += data
        blocks, pos, buf = [], 4, self._head
        if len(buf) < 4:
            return b""
        if buf[:4] != b"fLaC":  # not what we expect: pass through unchanged
            self._done = True
            return buf
        while True:
            if len(buf) < pos + 4:
                return b""
            kind, length = buf[pos] & 0x7F, int.from_bytes(buf[pos + 1:pos + 4], "big")
            if len(buf) < pos + 4 + length:
                return b""
            last = bool(buf[pos] & 0x80)
            if kind != 1:  # 1 = PADDING
                blocks.append(bytearray(buf[pos:pos + 4 + length]))
            pos += 4 + length
            if last:
                break
        for block in blocks:
            block[0] &= 0x7F
        blocks[-1][0] |= 0x80
        self._done = True
        self._head = b""
        return b"fLaC" + b"".join(bytes(b) for b in blocks) + buf[pos:]


_CONTAINERS = {  # fmt: (muxer, encoder, input sample format)
    "mp3": ("mp3", "libmp3lame", "flt"),
    "aac": ("adts", "aac", "flt"),
    "flac": ("flac", "flac", "s16"),
}


def _codec_rate(codec_name: str, sample_rate: int) -> int:
    """The input rate if the encoder takes it, else the nearest higher rate it takes (else its highest)."""
    import av

    rates = av.codec.Codec(codec_name, "w").audio_rates
    if not rates or sample_rate in rates:
        return sample_rate
    higher = [r for r in rates if r >= sample_rate]
    return min(higher) if higher else max(rates)


class _ContainerEncoder(StreamEncoder):
    """mp3 / aac / flac through an ffmpeg muxer writing to memory."""

    def __init__(self, fmt, sample_rate, speed, streaming):
        import av

        super().__init__(fmt, sample_rate, speed, streaming)
        muxer, codec, self._in_format = _CONTAINERS[fmt]
        self._av = av
        self.output_sample_rate = _codec_rate(codec, sample_rate)
        self._out = _Sink() if self.streaming else io.BytesIO()
        self._filter = _FlacStreamHeader() if (fmt == "flac" and self.streaming) else None
        self._container = av.open(self._out, mode="w", format=muxer)
        self._container_closed = False
        try:
            self._stream = self._container.add_stream(codec, rate=self.output_sample_rate, layout="mono")
            if fmt in BIT_RATES:
                self._stream.codec_context.bit_rate = BIT_RATES[fmt]
            # Opens the encoder and writes the file header now, so the first feed() has bytes to send.
            self._container.start_encoding()
        except Exception:
            self.close()
            raise
        self._pts = 0  # in input samples

    def _encode(self, x: np.ndarray) -> bytes:
        if x.size:
            if self._in_format == "s16":
                frame = self._av.AudioFrame.from_ndarray(to_pcm16(x)[None, :], format="s16", layout="mono")
            else:
                frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(_clean(x)[None, :]),
                                                         format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.time_base = Fraction(1, self.sample_rate)
            frame.pts = self._pts
            self._pts += x.size
            self._container.mux(self._stream.encode(frame))
        return self._take()

    def _flush(self) -> bytes:
        head = b""
        if self._pts == 0 and self.format != "flac":
            # No audio at all: an MP3/ADTS stream without frames is not decodable; send 10 ms of silence.
            head = self._encode(_silence(self.sample_rate))
        self._container.mux(self._stream.encode(None))
        self._close_container()
        if not self.streaming:
            return self._out.getvalue()
        return head + self._take()

    def _take(self) -> bytes:
        if not self.streaming:
            return b""
        data = self._out.take()
        return self._filter(data) if self._filter is not None else data

    def _close_container(self) -> None:
        if not self._container_closed:
            self._container_closed = True
            self._container.close()  # writes the trailer

    def close(self) -> None:
        try:
            self._close_container()
        except Exception:  # nothing to deliver any more; only the resources matter
            pass
        super().close()


# -------------------------------------------------------------------------------------------- Ogg Opus

_BITREV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, MSB first, init 0, no final xor), through zlib's reflected CRC:
    the unreflected CRC of `data` is the bit-reversal of the reflected CRC of the bit-reversed bytes."""
    raw = ~zlib.crc32(bytes(data).translate(_BITREV), 0xFFFFFFFF) & 0xFFFFFFFF  # init 0, no xor
    return int(f"{raw:032b}"[::-1], 2)


class _OggStream:
    """Pages of one logical Ogg bitstream (RFC 3533), whole packets only."""

    MAX_SEGMENTS = 255

    def __init__(self, serial: int):
        self.serial = serial & 0xFFFFFFFF
        self.sequence = 0
        self.started = False

    def page(self, packets: list[bytes], granule: int, *, eos: bool = False) -> bytes:
        lacing = bytearray()
        for packet in packets:
            lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
        if len(lacing) > self.MAX_SEGMENTS:
            raise ValueError("too many segments for one Ogg page")
        flags = (0 if self.started else 0x02) | (0x04 if eos else 0)
        self.started = True
        header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, self.serial, self.sequence, 0, len(lacing))
        page = bytearray(header + lacing + b"".join(packets))
        page[22:26] = struct.pack("<I", ogg_crc(page))
        self.sequence += 1
        return bytes(page)

    @staticmethod
    def segments(packet: bytes) -> int:
        return len(packet) // 255 + 1


class _OggOpusEncoder(StreamEncoder):
    """libopus packets (from PyAV, no muxer) paged here into Ogg Opus (RFC 7845)."""

    VENDOR = b"voxflow"
    PAGE_DURATION = OPUS_RATE  # non-streamed pages hold up to ~1 s (like ffmpeg's muxer)

    def __init__(self, fmt, sample_rate, speed, streaming):
        import av

        super().__init__(fmt, sample_rate, speed, streaming)
        self._av = av
        self.output_sample_rate = OPUS_RATE
        ctx = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = OPUS_RATE
        ctx.layout = "mono"
        ctx.format = "flt"
        ctx.bit_rate = BIT_RATES["opus"]
        ctx.time_base = Fraction(1, OPUS_RATE)
        ctx.open()
        self._ctx = ctx
        head = bytes(ctx.extradata)  # OpusHead as libopus made it (version, channels, pre-skip, rate, mapping)
        if head[:8] != b"OpusHead":
            raise RuntimeError("libopus did not produce an OpusHead header")
        self._pre_skip = struct.unpack_from("<H", head, 10)[0]
        self._head = head
        self._resampler = (av.AudioResampler(format="flt", layout="mono", rate=OPUS_RATE)
                           if sample_rate != OPUS_RATE else None)
        self._ogg = _OggStream(serial=int.from_bytes(np.random.bytes(4), "little"))
        self._headers_sent = False
        self._packets: list[tuple[bytes, int]] = []  # (packet, granule at its end) not yet paged
        self._pts = 0  # input samples fed
        self._coded = 0  # 48 kHz samples given to libopus
        self._granule = 0  # of the last page written

    def _headers(self) -> bytes:
        if self._headers_sent:
            return b""
        self._headers_sent = True
        tags = b"OpusTags" + struct.pack("<I", len(self.VENDOR)) + self.VENDOR + struct.pack("<I", 0)
        return self._ogg.page([self._head], 0) + self._ogg.page([tags], 0)

    def _encode(self, x: np.ndarray) -> bytes:
        if x.size:
            frame = self._frame(_clean(x), self.sample_rate, self._pts)
            self._pts += x.size
            self._code(self._resampler.resample(frame) if self._resampler is not None else [frame])
        if not self.streaming:
            return b""
        return self._headers() + self._pages(eos=False)

    def _flush(self) -> bytes:
        if self._resampler is not None:
            self._code(self._resampler.resample(None))
        if self._coded == 0:
            # No audio reached the encoder (none fed, or a few samples the resampler kept): 10 ms of silence,
            # so the stream has a packet to decode.
            self._code([self._frame(_silence(OPUS_RATE), OPUS_RATE, 0)])
        self._add(self._ctx.encode(None))
        return self._headers() + self._pages(eos=True)

    def _frame(self, x: np.ndarray, rate: int, pts: int):
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, :]), format="flt", layout="mono")
        frame.sample_rate = rate
        frame.time_base = Fraction(1, rate)
        frame.pts = pts
        return frame

    def _code(self, frames) -> None:
        for frame in frames:
            self._coded += frame.samples
            self._add(self._ctx.encode(frame))

    def _add(self, packets) -> None:
        for p in packets:
            # As ffmpeg's Ogg muxer: granule = end of the packet in 48 kHz samples, counted with the pre-skip
            # (libopus packet pts start at -pre_skip). The last packet's duration is the real remainder, so the
            # final granule tells decoders how much of its padding to drop.
            end = int(p.pts) + int(p.duration) + self._pre_skip
            self._packets.append((bytes(p), end))

    def _pages(self, eos: bool) -> bytes:
        out = []
        packets = self._packets
        self._packets = []
        page: list[bytes] = []
        segments = 0
        first_granule_in_page = None
        last_granule = 0            # set by the first packet, before any page can be closed
        for packet, granule in packets:
            n = _OggStream.segments(packet)
            too_long = (not self.streaming and first_granule_in_page is not None
                        and granule - first_granule_in_page > self.PAGE_DURATION)
            if page and (segments + n > _OggStream.MAX_SEGMENTS or too_long):
                out.append(self._ogg.page(page, last_granule))
                page, segments, first_granule_in_page = [], 0, None
            page.append(packet)
            segments += n
            last_granule = granule
            if first_granule_in_page is None:
                first_granule_in_page = granule
        if page:
            out.append(self._ogg.page(page, last_granule, eos=eos))
            self._granule = last_granule
        elif eos:
            # Nothing left to page: close the stream with an empty EOS page at the last granule.
            out.append(self._ogg.page([], self._granule, eos=True))
        return b"".join(out)


__all__ = ["FORMATS", "BIT_RATES", "OPUS_RATE", "content_type", "make_encoder", "encode_all", "StreamEncoder",
           "wav_header", "ogg_crc"]
