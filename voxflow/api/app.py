"""The FastAPI application: routes, auth, body-size limit, engine lifecycle.

    app = create_app(engine_client, ServerSettings(model_name=..., api_keys=(...)))

Lifespan: starts the engine client on the server's event loop (an in-process client must live on the loop that
uses it; a ProcessEngineClient spawns the engine process), reads `engine.model_info`, and on shutdown drains the
engine (in-flight requests finish, up to `drain_timeout_s`) and stops it. With `wait_for_engine=False` the app
answers at once while the model loads in the background: /health says 503 "loading" and speech requests get 503
with Retry-After until it is ready.

Auth: when `settings.api_keys` is non-empty, every /v1/* route (HTTP and WebSocket) needs
`Authorization: Bearer <key>` (WebSockets may instead pass `?api_key=<key>`, as browsers cannot set headers);
a missing or wrong key gets 401 in the OpenAI error envelope (a WebSocket handshake is refused with 403 via
close code 1008). `/`, `/health`, `/live`, `/ready` and `/metrics` stay open for probes and scrapers. Keys in a
URL would otherwise be written to the server log (uvicorn logs every WebSocket handshake's path and query at info,
and the access log every request's): `RedactSecretsFilter` replaces their values with "***" there.

Admission (admission.py, `app.state.vox.admission`): at most `settings.max_concurrent_requests` speech requests
run at once (HTTP requests, batch items and WebSocket sentences alike); the others wait in one FIFO queue of at most
`settings.max_queued_requests`, HTTP requests for up to `settings.admission_wait_s` before their 429.

WebSocket limits (routes_ws.py): `settings.max_ws_sessions` open sessions at once; `settings.allowed_origins`, the
browser origins besides the server's own that may open one (the Origin check against cross-site WebSocket
hijacking).

Body limit: a request body over `settings.max_body_bytes` gets 413, from its Content-Length before anything is
read, or while a chunked body is read.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import logging
import re
from typing import Any, Callable
from urllib.parse import unquote_plus

import fastapi.routing
from starlette.middleware.trustedhost import TrustedHostMiddleware
from fastapi import FastAPI, HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from voxflow.engine.gc_freeze import GcPauseWatch

from .errors import APIError, install_error_handlers
from .loop_lag import watch_loop_lag
from .metrics import Metrics
from .request_trace import RequestTrace
from .state import AppState, ServerSettings

log = logging.getLogger(__name__)

OPEN_PATHS = ("/", "/health", "/live", "/ready", "/metrics")
# other engineers' modules: included when they import
OPTIONAL_ROUTERS = ("routes_voices", "routes_ws", "routes_ws_elevenlabs")


def create_app(engine: Any, settings: ServerSettings | None = None, *, model_info: dict | None = None,
               wait_for_engine: bool = True, manage_engine: bool = True, drain_timeout_s: float = 30.0,
               on_engine_error: Callable[[BaseException], None] | None = None) -> FastAPI:
    """engine: an EngineClient (started and shut down here unless manage_engine=False). model_info: overrides
    `engine.model_info`. on_engine_error: called when a background start (wait_for_engine=False) fails."""
    settings = settings or ServerSettings()
    install_log_redaction()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state: AppState = app.state.vox
        if settings.trace_requests:
            state.request_trace = RequestTrace(settings.trace_requests)
        lag = (asyncio.ensure_future(watch_loop_lag(state.metrics.loop_lag.observe, settings.loop_lag_interval_s))
               if settings.loop_lag_interval_s > 0 else None)
        # the collector's pauses stop this process, its loop and every stream with it (engine/gc_freeze.py)
        pauses = {g: state.metrics.gc_pause.labels(generation=str(g)) for g in range(3)}
        gc_watch = GcPauseWatch(lambda gen, s: pauses[gen].observe(s))
        gc_watch.install()
        try:
            async with _engine_lifetime(state):
                yield
        finally:
            gc_watch.uninstall()
            if lag is not None:
                lag.cancel()
                await asyncio.wait([lag])       # (not `await lag`: that would swallow this task's own cancel)
            if state.request_trace is not None:
                state.request_trace.close()

    @contextlib.asynccontextmanager
    async def _engine_lifetime(state: AppState):
        loader = asyncio.ensure_future(_start_engine(state, engine, model_info, manage_engine))
        state.extra["loader"] = loader

        def _loaded(task: asyncio.Future) -> None:
            exc = None if task.cancelled() else task.exception()     # (retrieved: no "never retrieved" warning)
            if exc is not None and not wait_for_engine and on_engine_error is not None:
                on_engine_error(exc)
        loader.add_done_callback(_loaded)
        if wait_for_engine:
            await loader
        try:
            yield
        finally:
            state.extra["draining"] = True
            if not loader.done():
                loader.cancel()
                with contextlib.suppress(BaseException):
                    await loader
            if manage_engine:
                await engine.shutdown(drain=True, timeout=drain_timeout_s)

    app = FastAPI(title="voxflow", summary="Text-to-speech serving (OpenAI-compatible speech API)",
                  lifespan=lifespan)
    app.state.vox = AppState(engine=engine, settings=settings, model_info={}, metrics=Metrics(),
                             voices=_voice_store(settings),
                             extra={"ws_sessions": 0})
    app.state.vox.metrics.rejected.labels(reason="ws_sessions")     # WebSocket sessions over the cap: shown as 0
    install_error_handlers(app)

    from . import routes_batch, routes_elevenlabs, routes_misc, routes_speech
    app.include_router(routes_speech.router)
    app.include_router(routes_batch.router)
    app.include_router(routes_elevenlabs.router)
    app.include_router(routes_misc.router)
    for name in OPTIONAL_ROUTERS:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ImportError as e:
            log.warning("voxflow.api.%s not available (%s): its routes are not served", name, e)
            continue
        app.include_router(module.router)

    # Outermost first: auth, then the body limit.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_keys=settings.api_keys)
    if "*" not in settings.allowed_hosts:       # outermost: another host name is answered 400 before anything
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts), www_redirect=False)
    prime_first_request()
    return app


def prime_first_request() -> None:
    """Pay at start-up what the first speech request would pay (~25 ms on the test CPU: request 1 vs 2 of a fresh
    server): FastAPI reads an endpoint's source on its first call (inspect.getsourcelines, for its error messages;
    cached per function afterwards), and the audio encoders are imported on first use."""
    import voxflow.audio.encode  # noqa: F401 - imported here rather than inside the first request

    from .routes_batch import create_speech_batch
    from .routes_elevenlabs import text_to_speech, text_to_speech_stream
    from .routes_speech import create_speech
    extract = getattr(fastapi.routing, "_extract_endpoint_context", None)    # FastAPI's cache (private: may go)
    if extract is not None:
        for endpoint in (create_speech, create_speech_batch, text_to_speech, text_to_speech_stream):
            extract(endpoint)


async def _start_engine(state: AppState, engine: Any, model_info: dict | None, manage_engine: bool) -> None:
    try:
        if manage_engine:
            await engine.start()
        info = model_info if model_info is not None else getattr(engine, "model_info", None)
        if not info:
            raise RuntimeError("the engine client reports no model_info")
        state.model_info = dict(info)
        log.info("serving %s (%s, %s Hz)", state.settings.model_name, info.get("task"), info.get("sample_rate"))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        state.extra["startup_error"] = f"{type(e).__name__}: {e}"
        log.error("engine failed to start: %s", e)
        raise


def _voice_store(settings: ServerSettings):
    try:
        from .voices import VoiceStore
    except ImportError:
        return None
    return VoiceStore(settings.voices_dir)


# ---------------------------------------------------------------------------------------------- logging
# A query parameter whose (decoded) name says it holds a secret: api_key, key, access_token, token, password, ...
# Whole words of the name ("api_key", "access-token", "X-Auth"), not substrings: max_new_tokens, tokenizer,
# author and keyboard stay readable.
_SECRET_PARAM = re.compile(r"(?i)(^|[_\-.])(key|keys|token|secret|password|passwd|pwd|auth|authorization|signature"
                           r"|sig|credential|credentials)($|[_\-.])")
_QUERY_PARAM = re.compile(r"([?&])([^=&#\s\"]+)=([^&#\s\"]*)")
LOGGERS_TO_REDACT = ("uvicorn.error", "uvicorn.access")


def redact_secrets(text: str) -> str:
    """`text` with the value of every secret-named query parameter (see _SECRET_PARAM) replaced by ***."""
    if "=" not in text:
        return text

    def one(m: re.Match) -> str:
        return f"{m[1]}{m[2]}=***" if _SECRET_PARAM.search(unquote_plus(m[2])) else m[0]
    return _QUERY_PARAM.sub(one, text)


class RedactSecretsFilter(logging.Filter):
    """Redacts secrets from URL query strings in log records: the message and each string argument, in place
    (uvicorn's access formatter unpacks the argument tuple, so its shape is kept). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_secrets(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_secrets(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact_secrets(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install_log_redaction() -> None:
    """Put a RedactSecretsFilter on uvicorn's loggers (once). On the loggers themselves, not on handlers: uvicorn's
    logging setup (dictConfig, when uvicorn.Config is made) replaces their handlers but keeps their filters."""
    for name in LOGGERS_TO_REDACT:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecretsFilter) for f in logger.filters):
            logger.addFilter(RedactSecretsFilter())


# ---------------------------------------------------------------------------------------------- middleware
def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or not path.startswith("/v1")


class AuthMiddleware:
    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...] = ()):
        self.app = app
        self.keys = tuple(k.encode() for k in api_keys if k)

    def allowed(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        # Bearer, or ElevenLabs clients' xi-api-key header (routes_ws_elevenlabs.py)
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"xi-api-key", b"").strip()
        if not token and scope["type"] == "websocket":
            from urllib.parse import parse_qs
            q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            token = (q.get("api_key") or q.get("xi_api_key") or [""])[0].encode()
        # compare against every key (no early exit on a match: no timing hint about which key matched)
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (not self.keys or scope["type"] not in ("http", "websocket") or _is_open(scope["path"])
                or self.allowed(scope)):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "invalid or missing API key"})
            return
        err = APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
        response = err.response()
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, int(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                too_big = False
            if too_big:
                await self._reject(scope, receive, send)
                return
        seen = 0
        limit = self.max_bytes

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # FastAPI re-raises HTTPException from body reading; the error handler makes it the envelope.
                    raise HTTPException(413, f"request body is larger than {limit} bytes")
            return message

        await self.app(scope, counted, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = APIError(413, f"request body is larger than {self.max_bytes} bytes", code="request_too_large")
        response = err.response()
        response.headers["Connection"] = "close"
        await response(scope, receive, send)
