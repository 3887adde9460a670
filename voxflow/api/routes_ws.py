"""WS /v1/audio/speech/stream — text in (incrementally), audio out per sentence (vLLM-Omni protocol, §9).

Client -> server (JSON text frames):
    {"type": "session.config", ...}        first message (within CONFIG_TIMEOUT_S); may be sent again between
                                           utterances (sticky; replaces the previous config)
    {"type": "input.text", "text": "..."}  any number of times, cut anywhere (mid-word, mid-sentence)
    {"type": "input.done"}                 ends the utterance: flushes the rest of the text
    {"type": "session.close"}              ends an utterance still open as input.done would (its buffered text is
                                           spoken, then its session.done), finishes all the audio, then closes

Server -> client:
    {"type": "audio.start", "utterance_index": u, "sentence_index": i, "sentence_text": "...",
     "format": "pcm"|"wav", "sample_rate": 24000, "channels": 1}
    binary frames                          stream_audio=true: raw s16le PCM chunks as they are generated;
                                           false: one frame per sentence, the whole file (wav with real sizes,
                                           or raw pcm)
    {"type": "audio.done", "utterance_index": u, "sentence_index": i, "total_bytes": N, "error": false}
    {"type": "session.done", "utterance_index": u, "total_sentences": N}     after an utterance's last sentence
    {"type": "error", "message": "...", ...}                                  non-fatal unless the socket closes

Pipelining (what the peer does not do). A sentence goes to the engine the moment the splitter completes it,
while earlier sentences are still generating or playing (at most MAX_IN_FLIGHT per session generate at once,
the rest wait their turn); audio is sent strictly in sentence order by one sender task. Receiving never
waits for generation, so text keeps flowing in while audio flows out.

session.config fields: response_format ("wav" default, or "pcm"), stream_audio (bool, needs pcm),
split_granularity ("sentence" default, "clause", or "none" = one request per input.done), speed (1.0 only),
and every field of POST /v1/audio/speech with the same meaning and checks (schemas.plan_speech): model,
voice / speaker (preset, uploaded, or an OpenAI name aliased), task_type, language, instructions,
max_new_tokens, initial_codec_chunk_frames, seed, temperature, top_k, top_p, repetition_penalty, ref_audio /
ref_text / x_vector_only_mode / speaker_embedding (voice-clone models: a ref_audio is fetched and encoded ONCE
per config, then every sentence reuses the prompt). Unknown fields are ignored.

Limits: config message <= 4 MiB, other messages <= 128 KiB, text per utterance <= settings.ws_max_text_chars
(the piece that would exceed it is refused with an error), sentences longer than MAX_SENTENCE_CHARS are cut,
idle timeout settings.ws_idle_timeout_s (no message AND no audio pending; then an error and close 1000).
Invalid JSON (nesting too deep included), unknown types, bad fields -> an `error` message, the session goes on.
Client disconnect aborts every in-flight sentence in the engine. API keys are checked by the app's AuthMiddleware
(Bearer header or `?api_key=`; the server log shows such keys redacted).

Server-wide limits. Every sentence is a speech request holding one of settings.max_concurrent_requests slots while
it generates, taken in the one FIFO that HTTP requests wait in too (admission.py: nobody overtakes anybody). An
HTTP request waits there up to settings.admission_wait_s, then gets 429 and can be retried; a sentence cannot be
(its text was accepted), so it waits up to ADMIT_WAIT_S from its acceptance (never refused for a full queue); only
after that does it end with audio.done error=true (counted in voxflow_requests_rejected_total{reason="concurrency"},
as a 429). A session's sentences join the queue in their
order, at most MAX_IN_FLIGHT of them at a time. At most `max_ws_sessions` sessions
(serve --max-ws-sessions) are open at once: the next one is accepted and closed at once with code 1013 "try again
later" (counted as reason="ws_sessions").

Origin (cross-site WebSocket hijacking): browsers let any web page open a WebSocket to any host, 127.0.0.1
included, sending the page's Origin header; without an API key nothing else would stop a page the user visits
from using the server. A handshake whose Origin is neither the server's own host:port (the Host header) nor in
`allowed_origins` (serve --allowed-origins; "*" allows any) is refused with HTTP 403. Clients that send no Origin
(not browsers: SDKs, curl, websockets) are not affected.

Here: the route, the Origin check and the cap on open sessions. A session itself is ws_session.StreamSession; its
session.config is checked by ws_config.build_config.
"""
from __future__ import annotations

import logging
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket

from .ws_config import SessionConfig, build_config
from .ws_session import StreamSession, wav_header

log = logging.getLogger(__name__)
router = APIRouter()


# ---- route -------------------------------------------------------------------------------------------------
_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def origin_allowed(scope, allowed: tuple[str, ...] = ()) -> bool:
    """The handshake's Origin header is absent (not a browser), the server's own host:port (the Host header), or
    in `allowed` (exact origins, scheme://host[:port], or "*"). Anything else is a page of another site."""
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin")
    if origin is None:
        return True
    origin = origin.decode("latin-1").strip().rstrip("/").lower()
    if "*" in allowed or origin in {a.strip().rstrip("/").lower() for a in allowed}:
        return True
    try:
        o = urlsplit(origin)
        h = urlsplit("//" + headers.get(b"host", b"").decode("latin-1").strip().lower())
        default = _DEFAULT_PORTS.get(o.scheme)
        return (default is not None and o.hostname is not None and o.hostname == h.hostname
                and (o.port or default) == (h.port or default))
    except ValueError:                      # a malformed port
        return False


async def open_session(websocket: WebSocket, make) -> None:
    """Run the session `make(websocket)` builds, under the server's WebSocket rules: the Origin check and the cap on
    open sessions."""
    state = websocket.app.state.vox
    if not origin_allowed(websocket.scope, state.settings.allowed_origins):
        log.warning("WebSocket refused: Origin %r is not this server nor an allowed origin",
                    websocket.headers.get("origin"))
        await websocket.close(1008)         # before accept: the handshake is answered 403
        return
    # Each open session holds memory and a receive task even when idle: cap them server-wide. The check and the
    # increment have no await between them (atomic on the loop).
    limit = state.settings.max_ws_sessions
    if state.extra.get("ws_sessions", 0) >= limit:
        if state.metrics is not None:
            state.metrics.rejected.labels(reason="ws_sessions").inc()
        await websocket.accept()            # accepted then closed: the client sees the code and reason (a 403 not)
        await websocket.close(1013, f"too many WebSocket sessions (limit {limit}); try again later")
        return
    state.extra["ws_sessions"] = state.extra.get("ws_sessions", 0) + 1
    try:
        await make(websocket).run()
    finally:
        state.extra["ws_sessions"] -= 1


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket):
    await open_session(websocket, lambda ws: StreamSession(ws, websocket.app.state.vox))


__all__ = ["router", "StreamSession", "build_config", "SessionConfig", "wav_header", "origin_allowed",
           "open_session"]
