"""GET /v1/models, GET /health (+ /live, /ready), GET /metrics, GET /.

/health really asks the engine (its stats round trip): 200 when it answers, 503 with Retry-After while the model
is loading, the engine is dead or the server is draining. With the engine's stats it reports the server's
admission (admission.py): `in_flight`, speech requests running (holding a slot), and `waiting`, those queued
for one; `engine_streams` is the engine client's count of open request streams. /metrics refreshes the engine
gauges at scrape time.
Auth (app.py): /v1/* needs the API key when keys are configured; /, /health, /live, /ready, /metrics are open
(probes and scrapers carry no keys).
"""
from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import APIError
from .state import get_state
from .voice_names import openai_voice_table

router = APIRouter()

OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
HEALTH_TIMEOUT_S = 5.0


def served_model_ids(settings, model_info: dict | None) -> list[str]:
    """Every id a client may send as `model` (see routes_speech.resolve_model)."""
    ids = [settings.model_name]
    base = os.path.basename(os.path.normpath(settings.model_name))
    if base and base not in ids:
        ids.append(base)
    name = (model_info or {}).get("name")
    if name and name not in ids:
        ids.append(name)
    return ids


def _model_card(state) -> dict:
    info = state.model_info or {}
    task = info.get("task")
    return {
        "id": state.settings.model_name, "object": "model", "created": 0, "owned_by": "voxflow",
        # voxflow extension: what a client needs without per-model tables
        "aliases": served_model_ids(state.settings, info)[1:] + list(OPENAI_MODEL_ALIASES),
        "family": info.get("family"),
        "task_types": [task] if task else [],
        "sample_rate": info.get("sample_rate"),
        "channels": 1,
        "languages": info.get("languages", []),
        "voices": info.get("voices", []),
        "openai_voices": openai_voice_table(info.get("voices") or []),
        "supports_instructions": info.get("supports_instructions", False),
        "response_formats": list(_formats()),
        "stream_formats": ["audio", "sse"],
        "streaming": True,
    }


def _formats() -> tuple[str, ...]:
    try:
        from ..audio.encode import FORMATS
        return tuple(FORMATS)
    except ImportError:
        from .schemas import RESPONSE_FORMATS
        return RESPONSE_FORMATS


@router.get("/v1/models")
async def list_models(request: Request):
    state = get_state(request)
    if not state.model_info:
        raise APIError(503, "the model is still loading", retry_after=5)
    return {"object": "list", "data": [_model_card(state)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    state = get_state(request)
    if not state.model_info:
        raise APIError(503, "the model is still loading", retry_after=5)
    card = _model_card(state)
    if model_id != card["id"] and model_id not in card["aliases"]:
        raise APIError(404, f"model '{model_id}' is not served here (serving '{card['id']}')", param="model",
                       code="model_not_found")
    return card


# The engine stats /health shows. ttfp_breakdown_ms (the engine's own split of first-audio latency, mean ms over
# the requests served since it started) is there so that an HTTP benchmark, which reads /health after its run,
# records how much of its TTFP the engine itself took (the rest went to the serving path), and on a GPU the engine's
# memory footprint (engine/gpu_memory.py: in use now, and its peak total); the prompt positions admitted and those
# the prefix cache held (read before and after a run, they say how much of its prompts the server had seen); the
# Triton kernels compiled after startup (engine/kernel_compiles.py: each stalled every stream); the GPU allocator's
# retries (a cudaMalloc failed near the memory limit: the cache freed, the GPU synchronized); and the engine's
# startup record (where a start went: graph captures, Triton's compiles, the codec's precision check, the KV pool;
# a first start on a machine compiles every kernel, minutes on a GPU).
HEALTH_ENGINE_KEYS = ("running", "waiting", "kv_usage", "ttfp_breakdown_ms", "gpu_memory_used_bytes",
                      "peak_gpu_memory_total_bytes", "prompt_tokens", "prompt_tokens_cached", "preemptions",
                      "kernels_compiled_while_serving", "alloc_retries", "startup")


async def _health(request: Request) -> JSONResponse:
    state = get_state(request)
    status = {"status": "ok", "model": state.settings.model_name}
    if state.extra.get("draining"):
        status.update(status="draining")
        return JSONResponse(status, status_code=503, headers={"Retry-After": "5"})
    if state.extra.get("startup_error"):
        status.update(status="error", error=state.extra["startup_error"])
        return JSONResponse(status, status_code=503, headers={"Retry-After": "30"})
    if not state.model_info:
        status.update(status="loading")
        return JSONResponse(status, status_code=503, headers={"Retry-After": "5"})
    health = await state.engine.health(timeout=HEALTH_TIMEOUT_S)
    if state.metrics is not None:
        state.metrics.observe_engine(health)
    stats = health.get("stats") or {}
    admission = state.admission
    status.update(engine={k: stats[k] for k in HEALTH_ENGINE_KEYS if k in stats}, in_flight=admission.running,
                  waiting=admission.waiting, engine_streams=health.get("in_flight"))
    if not health.get("alive") or health.get("stats") is None:
        status.update(status="unavailable", error=health.get("error"))
        return JSONResponse(status, status_code=503, headers={"Retry-After": "5"})
    return JSONResponse(status)


@router.get("/health")
async def health(request: Request):
    return await _health(request)


@router.get("/live")
async def live(request: Request):
    return await _health(request)


@router.get("/ready")
async def ready(request: Request):
    return await _health(request)


@router.get("/metrics")
async def metrics(request: Request):
    state = get_state(request)
    if state.model_info and not state.extra.get("draining"):
        state.metrics.observe_engine(await state.engine.health(timeout=HEALTH_TIMEOUT_S))
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@router.get("/")
async def root(request: Request):
    state = get_state(request)
    return {"name": "voxflow", "object": "server", "model": state.settings.model_name,
            "ready": bool(state.model_info), "endpoints": ["/v1/audio/speech", "/v1/models", "/v1/audio/voices",
                                                           "/v1/audio/speech/stream", "/health", "/metrics"]}
