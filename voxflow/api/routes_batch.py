"""POST /v1/audio/speech/batch (vLLM-Omni): several whole-file speech requests in one call, one JSON answer.

Body: batch-level defaults, any field of POST /v1/audio/speech but `input`, `stream` and `stream_format` (voice,
instructions, response_format, speed, task_type, language, ref_audio, ref_text, x_vector_only_mode,
max_new_tokens, initial_codec_chunk_frames, model, seed, the sampling fields, ...), and
`items: [{"input": "...", <any of those fields: overrides the default for this item>}]`, 1 to
settings.max_batch_items of them. An item's `null` keeps the batch default. Each item then means exactly what
the same single request would (SpeechRequestBody, plan_speech) and gets the same audio bytes.

Answer, 200 whenever the batch itself is valid, however many items failed:
    {"id": "speech-batch-<hex>", "total": N, "succeeded": n, "failed": N - n,
     "results": [{"index": i, "status": "success" | "error", "status_code": 200 | what the single endpoint
                  would have answered, "audio_data": base64 of the file | null, "media_type": its Content-Type
                  | null, "sample_rate", "usage": {input_tokens, output_tokens, total_tokens} | null,
                  "error": null | {"message", "type", "param", "code"} (the single endpoint's error for it)}]}
One failing item (an empty input, an unknown voice, the engine's own validation, a full engine queue) fails
only itself.

The whole request fails (OpenAI error envelope) on: 400 a malformed batch (items missing, not a list, empty,
more than max_batch_items, an item not an object; `stream` / `stream_format` set anywhere, as a JSON answer
cannot stream; `input` at batch level; a default of the wrong type or range; all inputs together longer than
settings.max_batch_input_chars), 404 a batch-level `model` this server does not serve, 503 while the model
loads, 401 without a valid API key (AuthMiddleware, as every /v1 route), and 429 with Retry-After when the batch
got no slot within settings.admission_wait_s (counted as a rejection per valid item).

Admission, item by item: each valid item holds one of settings.max_concurrent_requests slots as its own request
would, taken in item order in the server-wide FIFO of admission.py. The first waits as a single request does (its
429 refuses the whole batch: nothing ran); once one runs, the batch's next item joins the FIFO's tail and waits its
turn however long (the batch's answer waits for its running items anyway), and so on. So a batch runs in the slots
free now and in those that free up, a batch larger than max_concurrent_requests runs in parts, and requests
arriving meanwhile are served between its items instead of behind all of them (the price: under sustained load a
batch of N items takes about N turns of the queue). Before (all or none), a batch at the head held back everyone
behind it while it waited for enough slots, which stayed idle meanwhile. A later item refused by a shutdown fails
alone (503 server_shutting_down in its entry).

The admitted items run concurrently through the engine (which batches them). A reference clip that several items
name (the batch-level ref_audio above all) is fetched and decoded once. A client that disconnects aborts every
unfinished item in the engine and takes its queued one out of the queue, each counted as a 499 (client_disconnect).
Metrics: each item that ran or was still waiting is one request (voxflow_requests_total by status, latency,
audio), as a whole-file request; its latency ends when its file is encoded, the batch's answer leaving with its
last item.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import APIError, as_api_error, bad_request, validation_error
from .routes_speech import ClientGone, SpeechJob, admit, check_loaded, until_disconnect
from .schemas import SpeechPlan, SpeechRequestBody, check_model, plan_speech, ref_audio_pcm
from .state import AppState, get_state

log = logging.getLogger(__name__)
router = APIRouter()

STREAM_FIELDS = ("stream", "stream_format")


class BatchSpeechRequestBody(BaseModel):
    """`items` and the batch-level defaults (every other field, kept as sent: they are validated as the fields of
    a SpeechRequestBody, once for the batch and per item with its overrides)."""
    model_config = ConfigDict(extra="allow")
    items: list[dict[str, Any]]

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


@router.post("/v1/audio/speech/batch")
async def create_speech_batch(body: BatchSpeechRequestBody, request: Request):
    arrived = time.monotonic()
    state = get_state(request)
    check_loaded(state)
    defaults = check_batch(state, body)
    try:
        outcomes = await until_disconnect(run_batch(state, defaults, body.items, arrived), request.receive)
    except ClientGone:                  # every item was aborted and counted as 499 (run_batch)
        return Response(status_code=499)
    # base64 and JSON of up to max_batch_input_chars of speech (~100 MB of wav) take a while: off the event loop,
    # which meanwhile sends other requests' streams.
    return Response(await asyncio.to_thread(render, outcomes), media_type="application/json")


def check_batch(state: AppState, body: BatchSpeechRequestBody) -> SpeechRequestBody:
    """The batch as a whole (APIError for the whole request): item count, no streaming, the total input length,
    and the defaults, returned validated (`input` a placeholder: each item brings its own)."""
    settings, items, defaults = state.settings, body.items, body.defaults
    if not items:
        raise bad_request("items is empty; give at least one {\"input\": ...}", "items")
    if len(items) > settings.max_batch_items:
        raise bad_request(f"the batch has {len(items)} items; the maximum is {settings.max_batch_items}", "items",
                          code="too_many_items")
    if "input" in defaults:
        raise bad_request("input belongs in each item of items, not at batch level", "input")
    for where, fields in [("", defaults)] + [(f"items.{i}.", item) for i, item in enumerate(items)]:
        for name in STREAM_FIELDS:
            if fields.get(name) not in (None, False):
                raise bad_request(f"{where}{name}: a batch is answered as one JSON document and cannot stream; "
                                  "use POST /v1/audio/speech to stream", where + name, code="unsupported_in_batch")
    total = sum(len(item["input"]) for item in items if isinstance(item.get("input"), str))
    if total > settings.max_batch_input_chars:
        raise bad_request(f"the items' inputs are {total} characters long together; the maximum for a batch is "
                          f"{settings.max_batch_input_chars}", "items", code="string_too_long")
    try:
        parsed = SpeechRequestBody.model_validate({**defaults, "input": "-"})
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    check_model(settings, state.model_info, parsed.model)
    return parsed


def item_body(defaults: SpeechRequestBody, item: dict[str, Any]) -> SpeechRequestBody:
    """The single request an item stands for: the defaults, overridden by every field the item gives (not null).
    The item is validated on its own, so its errors name its fields as a single request's would; merging parsed
    models (not raw dicts) lets an item's spelling of a field (`speaker`, `references`, `extra_params`) override
    the default's other spelling of it."""
    try:
        own = SpeechRequestBody.model_validate(item)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    given = {name: getattr(own, name) for name in own.model_fields_set if getattr(own, name) is not None}
    return defaults.model_copy(update=given)


class SharedRefAudio:
    """plan_speech's reference-clip resolver for one batch: each distinct ref_audio value is fetched and decoded
    once, however many items name it (items planned at the same time await the one task); a failure is shared
    too: every item naming that clip gets its error."""

    def __init__(self, state: AppState):
        self.state = state
        self.tasks: dict[str, asyncio.Future] = {}

    async def __call__(self, value: str) -> bytes:
        if value not in self.tasks:
            self.tasks[value] = asyncio.ensure_future(ref_audio_pcm(self.state, value))
        return await self.tasks[value]

    def close(self) -> None:
        for task in self.tasks.values():    # left running only when planning was cancelled (client gone)
            task.cancel()


async def run_batch(state: AppState, defaults: SpeechRequestBody, items: list[dict],
                    arrived: float) -> list[tuple[bytes | APIError, SpeechJob | None]]:
    """Plan every item, admit those that planned, run them concurrently: in item order, each item's file or
    error and its job (None when it failed before admission). Cancelled (the client left): every unfinished
    item is aborted in the engine and closed as 499 before this returns."""
    refs = SharedRefAudio(state)
    try:
        plans = await asyncio.gather(*(_plan(state, defaults, item, refs) for item in items))
    finally:
        refs.close()
    runnable = [i for i, plan in enumerate(plans) if isinstance(plan, SpeechPlan)]
    jobs = {i: SpeechJob(state, plans[i], arrived) for i in runnable}
    refused: dict[int, APIError] = {}
    running: dict[int, asyncio.Future] = {}
    try:
        for i, job in jobs.items():
            try:
                if not running:             # the first slot: as a single request's wait, or the batch is refused
                    await admit(state, counts_for=len(jobs))
                else:                       # the batch runs: its next item waits its turn, however long
                    await admit(state, no_deadline=True)
            except APIError as e:
                if running:                 # (only a shutdown refuses a later item: this one alone fails)
                    refused[i] = e
                    job.discard()
                    continue
                for other in jobs.values():     # refused: the items count as rejections only, as they never ran
                    other.discard()
                raise
            job.holds_slot = True           # no await since the grant: the slot is the job's, which gives it back
            running[i] = asyncio.ensure_future(_run(job))
        outs = await asyncio.gather(*running.values())
    finally:
        for task in running.values():       # (all done, unless the client left while a later item was queued)
            task.cancel()
        # Closed already, unless cancelled while queued or before it began. The ones not begun first (no engine
        # request: their close does not suspend), so a second cancellation during the wait below cannot leave one
        # holding its slot.
        for job in jobs.values():
            if job.gen is None:
                await job.close(499, "client_disconnect")
        await asyncio.gather(*running.values(), return_exceptions=True)     # each job closed on its way out
        for job in jobs.values():
            await job.close(499, "client_disconnect")
    done = {**dict(zip(running, outs)), **refused}
    return [(done.get(i, plan), jobs.get(i)) for i, plan in enumerate(plans)]


async def _plan(state: AppState, defaults: SpeechRequestBody, item: dict, refs: SharedRefAudio):
    """The item's SpeechPlan, or the APIError the single endpoint would have answered it with."""
    try:
        return await plan_speech(state, item_body(defaults, item), resolve_ref_audio=refs)
    except Exception as e:
        return _logged(e)


async def _run(job: SpeechJob) -> bytes | APIError:
    """One admitted item: its encoded file or its error; the job is closed on every way out (begin, file_data)."""
    try:
        await job.begin()
        return await job.file_data()
    except Exception as e:
        return _logged(e)


def _logged(e: Exception) -> APIError:
    if not isinstance(e, APIError):         # a bug, not a bad item: keep its traceback
        log.error("speech batch item failed", exc_info=e)
    return as_api_error(e)


def render(outcomes: list[tuple[bytes | APIError, SpeechJob | None]]) -> bytes:
    """run_batch's outcomes as the answer's JSON document."""
    results = [_entry(i, out, job) for i, (out, job) in enumerate(outcomes)]
    ok = sum(r["status"] == "success" for r in results)
    return json.dumps({"id": f"speech-batch-{uuid.uuid4().hex}", "results": results, "total": len(results),
                       "succeeded": ok, "failed": len(results) - ok}, separators=(",", ":")).encode()


def _entry(index: int, out: bytes | APIError, job: SpeechJob | None) -> dict:
    if isinstance(out, APIError):
        return {"index": index, "status": "error", "status_code": out.status, "audio_data": None,
                "media_type": None, "sample_rate": None, "usage": None, "error": out.body()["error"]}
    return {"index": index, "status": "success", "status_code": 200, "audio_data": base64.b64encode(out).decode(),
            "media_type": job.encoder.content_type, "sample_rate": int(job.plan.headers(job.encoder)["X-Sample-Rate"]),
            "usage": job.usage(), "error": None}
