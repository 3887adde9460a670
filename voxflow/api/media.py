"""Reference audio for voice cloning: fetch or decode what a request names, within the operator's limits.

    wav = await resolve_ref_audio(value, settings, target_sr=24000)    # float32 mono at the model rate

`value` may be
- a data URI `data:audio/wav;base64,....` (also `application/octet-stream` or no media type),
- bare base64 of an audio file,
- an `http(s)://` URL — only when its host is listed in `settings.allowed_media_domains` (an entry
  ".example.com" also admits its subdomains); fetched with httpx, redirects followed by hand (at most 3) and
  only to allowed hosts, connect/read timeouts, the body capped while streaming,
- a local path or `file://` URL — only when `settings.allowed_local_media_path` is set, and only for a regular
  file inside it after `..` and symlinks are resolved (relative paths are taken relative to that folder).

Nothing touches the network or the filesystem unless the operator allowed it: a URL whose host is not
allowed is rejected before any connection, a path outside the folder (checked lexically first, then again
after resolving symlinks) before the file is opened. Limits: `max_ref_audio_bytes` on the encoded bytes
(413), `min_ref_audio_seconds` .. `max_ref_audio_seconds` on the duration (400; probed from the header where
libsndfile can, and decoding stops as soon as it passes the limit, so a small, highly compressed file cannot make
the server decode more), at most 8 channels (voxflow.audio.io.MAX_CHANNELS). Decoding is voxflow.audio.io (full
precision, channel average to mono, librosa resampling, as the official Qwen3-TTS code), off the event loop.
Every failure is an `APIError` with `param` "ref_audio" (or the `param` given).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import os
import re
import stat
import urllib.parse

import numpy as np

from voxflow.audio.io import AudioReadError, AudioTooLongError, read_audio, resample

from .errors import APIError, bad_request

FETCH_TIMEOUT_S = 10.0          # connect / read / write / pool, each
MAX_REDIRECTS = 3
MIN_BARE_BASE64_CHARS = 128
_B64_RE = re.compile(r"[A-Za-z0-9+/_\-\s]+={0,2}")
_DATA_MEDIA_OK = ("audio/", "application/octet-stream", "video/")   # video/webm, video/mp4 carry audio too
# Whitespace and control characters (urlsplit silently drops tab/CR/LF, httpx refuses them: the host we check
# and the one fetched could differ) and backslashes (browsers read one as "/") have no place in a URL we fetch.
_URL_BAD_CHAR = re.compile(r"[\x00-\x20\x7f-\x9f\\]|\s")


def _err(status: int, message: str, param: str, code: str) -> APIError:
    return APIError(status, message, param=param, code=code)


def _too_large(n: int | None, limit: int, param: str) -> APIError:
    got = f" ({n} bytes)" if n is not None else ""
    return _err(413, f"reference audio is too large{got}; the limit is {limit} bytes", param, "too_large")


# ---- public API --------------------------------------------------------------------------------------------
async def resolve_ref_audio(value: str, settings, *, target_sr: int, param: str = "ref_audio") -> np.ndarray:
    """Fetch / decode `value` (see the module doc) to float32 mono PCM at `target_sr`."""
    data = await load_ref_audio_bytes(value, settings, param=param)
    return await decode_ref_audio(data, settings, target_sr=target_sr, param=param)


async def load_ref_audio_bytes(value: str, settings, *, param: str = "ref_audio") -> bytes:
    """The encoded audio file `value` names (within the limits and permissions), not yet decoded."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request("ref_audio must be a non-empty string (data URI, base64, URL or file path)", param)
    value = value.strip()
    limit = int(settings.max_ref_audio_bytes)
    scheme = value.split(":", 1)[0].lower() if ":" in value[:16] else ""
    if scheme == "data":
        return _from_data_uri(value, limit, param)
    if scheme in ("http", "https"):
        return await _fetch_url(value, settings, limit, param)
    if scheme == "file":
        return await _read_local(_file_url_path(value, param), settings, limit, param)
    if scheme and len(scheme) > 1 and re.fullmatch(r"[a-z][a-z0-9+.\-]*", scheme) and "//" in value[:24]:
        raise bad_request(f"unsupported ref_audio URL scheme {scheme!r}: use data:, http(s): or file:", param,
                          code="unsupported_scheme")
    if _looks_like_base64(value):
        return _from_base64(value, limit, param)
    return await _read_local(value, settings, limit, param)


async def decode_ref_audio(data: bytes, settings, *, target_sr: int, param: str = "ref_audio") -> np.ndarray:
    """Encoded bytes -> float32 mono at `target_sr`, with the size and duration limits (off the event loop)."""
    limit = int(settings.max_ref_audio_bytes)
    if len(data) > limit:
        raise _too_large(len(data), limit, param)
    if not data:
        raise bad_request("reference audio is empty", param, code="invalid_audio")
    return await asyncio.to_thread(_decode_sync, bytes(data), settings, int(target_sr), param)


# ---- decoding ----------------------------------------------------------------------------------------------
def _check_duration(seconds: float, settings, param: str) -> None:
    lo, hi = float(settings.min_ref_audio_seconds), float(settings.max_ref_audio_seconds)
    if seconds > hi:
        raise bad_request(f"reference audio is {seconds:.2f} s long; at most {hi:g} s are allowed", param,
                          code="audio_too_long")
    if seconds < lo:
        raise bad_request(f"reference audio is {seconds:.2f} s long; at least {lo:g} s are needed", param,
                          code="audio_too_short")


def _probe_seconds(data: bytes) -> float | None:
    """Duration from the header (libsndfile), without decoding; None when it cannot tell."""
    try:
        import soundfile as sf
        info = sf.info(io.BytesIO(data))
        if info.samplerate > 0 and 0 < info.frames < 2**62:      # libsndfile says SF_COUNT_MAX when unknown
            return info.frames / info.samplerate
    except Exception:
        pass
    return None


def _decode_sync(data: bytes, settings, target_sr: int, param: str) -> np.ndarray:
    hi = float(settings.max_ref_audio_seconds)
    probed = _probe_seconds(data)
    if probed is not None and probed > hi * 1.01 + 0.1:
        _check_duration(probed, settings, param)          # refuse a long clip before decoding it
    try:
        # max_seconds: PyAV formats (and FLAC without a length) have no header duration to check first; the
        # decoder stops as soon as it passes the limit, so the work and memory are bounded by it, not the file.
        samples, sr = read_audio(data, max_seconds=hi)
    except AudioTooLongError:
        raise bad_request(f"reference audio is longer than {hi:g} s; at most {hi:g} s are allowed", param,
                          code="audio_too_long") from None
    except AudioReadError as e:
        raise bad_request(_decode_failure(e, len(data)), param, code="invalid_audio") from None
    _check_duration(samples.shape[0] / sr, settings, param)
    return np.ascontiguousarray(resample(samples, sr, target_sr), dtype=np.float32)


_OPENING_REPR = re.compile(r"Error opening\s*<[^<>]*\bat 0x[0-9a-fA-F]+>:\s*")    # libsndfile's, naming our BytesIO
_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9a-fA-F]+>")
_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


def _decode_failure(e: AudioReadError, size: int) -> str:
    """The decoders' complaint, for a client: without object reprs ("<_io.BytesIO object at 0x...>", an address
    in this process), errno numbers or PyAV's "'<none>'" file name, with the formats that were tried."""
    text = _OBJECT_REPR.sub("", _OPENING_REPR.sub("", str(e)))
    text = _ERRNO.sub("", text).replace(": '<none>'", "")
    head, sep, detail = text.partition(" (")
    if head.startswith("cannot decode audio") and sep:         # voxflow.audio.io: both decoders failed
        return (f"could not decode the reference audio ({size} bytes): not a format libsndfile (WAV, FLAC, OGG, "
                f"MP3) or FFmpeg (M4A, AAC, WebM, ...) can read ({detail}")
    return f"could not use the reference audio: {text}"


# ---- inline data -------------------------------------------------------------------------------------------
def _looks_like_base64(value: str) -> bool:
    """Bare base64 vs. a local path: base64 of any usable clip is kilobytes long and has no '.'; a path is short
    or has a dot (an extension). Shorter strings are taken as paths."""
    return len(value) >= MIN_BARE_BASE64_CHARS and _B64_RE.fullmatch(value) is not None


def _b64decode(text: str, limit: int, param: str) -> bytes:
    compact = "".join(text.split())
    if len(compact) * 3 // 4 > limit + 2:
        raise _too_large(len(compact) * 3 // 4, limit, param)
    compact += "=" * (-len(compact) % 4)
    try:
        if "-" in compact or "_" in compact:
            data = base64.urlsafe_b64decode(compact)
        else:
            data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("ref_audio is not valid base64", param, code="invalid_base64") from None
    if len(data) > limit:
        raise _too_large(len(data), limit, param)
    return data


def _from_base64(value: str, limit: int, param: str) -> bytes:
    return _b64decode(value, limit, param)


def _from_data_uri(value: str, limit: int, param: str) -> bytes:
    head, sep, payload = value[5:].partition(",")
    if not sep:
        raise bad_request("malformed data URI: no ',' before the data", param, code="invalid_data_uri")
    parts = [p.strip() for p in head.split(";")]
    media = parts[0].lower()
    if media and not media.startswith(_DATA_MEDIA_OK):
        raise bad_request(f"data URI media type must be audio/*, got {media!r}", param, code="invalid_data_uri")
    if "base64" in (p.lower() for p in parts[1:]):
        return _b64decode(payload, limit, param)
    if len(payload) > 3 * limit:
        raise _too_large(None, limit, param)
    data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise _too_large(len(data), limit, param)
    return data


# ---- local files -------------------------------------------------------------------------------------------
def _file_url_path(value: str, param: str) -> str:
    parsed = urllib.parse.urlparse(value)
    if parsed.netloc not in ("", "localhost"):
        raise bad_request("file:// URLs must name a local path (file:///path)", param, code="invalid_url")
    if parsed.query or parsed.fragment:
        raise bad_request("file:// URLs take no query or fragment", param, code="invalid_url")
    path = urllib.parse.unquote(parsed.path)
    if not path:
        raise bad_request("file:// URL without a path", param, code="invalid_url")
    return path


def _inside(root: str, path: str) -> bool:
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:                        # different drives (Windows)
        return False


def local_media_path(value: str, settings, param: str = "ref_audio") -> str:
    """The real path `value` names inside `allowed_local_media_path` (APIError otherwise); nothing is opened.

    Lexical check first (`..`, absolute paths elsewhere): rejected without touching the filesystem. Then
    symlinks are resolved (os.path.realpath) and the result must still lie inside the resolved folder."""
    allowed = getattr(settings, "allowed_local_media_path", None)
    if not allowed:
        raise bad_request("ref_audio: local files are not enabled on this server (give a data URI, base64 or "
                          "an allowed URL)", param, code="local_files_disabled")
    if "\x00" in value:
        raise bad_request("ref_audio path contains a NUL byte", param, code="invalid_path")
    root_lex = os.path.normpath(os.path.abspath(allowed))
    candidate = value if os.path.isabs(value) else os.path.join(root_lex, value)
    lexical = os.path.normpath(candidate)
    if not _inside(root_lex, lexical):
        raise _err(400, "ref_audio path is outside the allowed media folder", param, "path_not_allowed")
    root_real = os.path.realpath(allowed)
    real = os.path.realpath(os.path.join(root_real, os.path.relpath(lexical, root_lex)))
    if not _inside(root_real, real):
        raise _err(400, "ref_audio path is outside the allowed media folder", param, "path_not_allowed")
    return real


async def _read_local(value: str, settings, limit: int, param: str) -> bytes:
    path = local_media_path(value, settings, param)
    return await asyncio.to_thread(_read_file_capped, path, limit, param)


def _read_file_capped(path: str, limit: int, param: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise bad_request("ref_audio file not found", param, code="file_not_found") from None
    except OSError as e:
        raise bad_request(f"ref_audio file cannot be opened ({e.strerror})", param, code="file_unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad_request("ref_audio must name a regular file", param, code="file_unreadable")
        if st.st_size > limit:
            raise _too_large(st.st_size, limit, param)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(None, limit, param)
    return data


# ---- URLs --------------------------------------------------------------------------------------------------
def host_allowed(host: str | None, domains) -> bool:
    """`host` equals an allowed domain, or is a subdomain of an entry written ".example.com"."""
    if not host:
        return False
    host = host.lower().rstrip(".")
    for d in domains or ():
        d = str(d).lower().strip().rstrip(".")
        if not d:
            continue
        if d.startswith("."):
            if host == d[1:] or host.endswith(d):
                return True
        elif host == d:
            return True
    return False


def _check_url(url: str, settings, param: str) -> None:
    if _URL_BAD_CHAR.search(url):
        raise bad_request("ref_audio URL contains whitespace, a control character or a backslash (percent-encode "
                          "them)", param, code="invalid_url")
    try:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname
        _ = parsed.port                       # raises on a malformed port
    except ValueError:
        raise bad_request("ref_audio URL is malformed", param, code="invalid_url") from None
    if parsed.scheme.lower() not in ("http", "https"):
        raise bad_request(f"ref_audio redirect to an unsupported scheme {parsed.scheme!r}", param,
                          code="unsupported_scheme")
    domains = getattr(settings, "allowed_media_domains", ()) or ()
    if not domains:
        raise _err(400, "ref_audio URLs are not enabled on this server", param, "url_not_allowed")
    if not host_allowed(host, domains):
        raise _err(400, f"ref_audio host {host!r} is not in the allowed media domains", param, "url_not_allowed")


async def _fetch_url(url: str, settings, limit: int, param: str) -> bytes:
    _check_url(url, settings, param)          # before any connection
    import httpx

    timeout = httpx.Timeout(FETCH_TIMEOUT_S)
    try:
        async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                async with client.stream("GET", url, headers={"Accept": "audio/*, */*;q=0.5"}) as resp:
                    if resp.is_redirect:
                        location = resp.headers.get("location")
                        if not location:
                            raise bad_request("ref_audio URL redirected without a location", param,
                                              code="fetch_failed")
                        url = str(resp.url.join(location))
                        _check_url(url, settings, param)
                        continue
                    if resp.status_code != 200:
                        raise bad_request(f"fetching ref_audio failed: HTTP {resp.status_code}", param,
                                          code="fetch_failed")
                    declared = resp.headers.get("content-length")
                    if declared and declared.isdigit() and int(declared) > limit:
                        raise _too_large(int(declared), limit, param)
                    buf = bytearray()
                    async for chunk in resp.aiter_bytes():
                        buf += chunk
                        if len(buf) > limit:
                            raise _too_large(None, limit, param)
                    return bytes(buf)
            raise bad_request(f"ref_audio URL redirected more than {MAX_REDIRECTS} times", param,
                              code="fetch_failed")
    except APIError:
        raise
    except httpx.InvalidURL:                  # not an httpx.HTTPError; a redirect's Location can be malformed too
        raise bad_request("ref_audio URL is malformed", param, code="invalid_url") from None
    except httpx.TimeoutException:
        raise bad_request("fetching ref_audio timed out", param, code="fetch_timeout") from None
    except httpx.HTTPError as e:
        raise bad_request(f"fetching ref_audio failed: {type(e).__name__}", param, code="fetch_failed") from None


__all__ = ["resolve_ref_audio", "load_ref_audio_bytes", "decode_ref_audio", "local_media_path", "host_allowed"]
