"""The HTTP load generator: any server that speaks `POST /v1/audio/speech` (voxflow, vLLM-Omni, others).

One asyncio event loop and one HTTP/1.1 client (http.py: a keep-alive connection per request in flight; the
load shape alone decides how many requests are in flight). Per level:
- closed loop (`concurrency=c`): c workers, each sends its next prompt when its previous request ends;
- open loop (`rate=λ`): sends at Poisson arrival times (exponential gaps, seeded; λ = inf sends all at once),
  regardless of completions, optionally capped at `max_concurrency` in flight.
Warm-up requests run first at the same shape and are recorded but excluded from every statistic.

Per request: `perf_counter()` just before sending (the body is encoded beforehand; a new connection's set-up
counts, as for any client), then the arrival of every response read (no content decoding); the readers
(readers.py) say which bytes are audio. A `Server-Timing` header (voxflow: where the first audio's time went
inside the server) is recorded. Failures are recorded by kind, never raised: http_<status> (429, 503, 500, ...),
connect_error, read_error (connection dropped or body incomplete), timeout, stream_error (SSE error event, bad
WAV), no_audio (200 without samples), client_error (anything else).
"""
from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .http import ConnectError, HTTPError, HttpClient, ReadError, ReadTimeout
from .metrics import RequestRecord
from .readers import StreamError, make_reader
from .workloads import Prompt, RequestSpec

DEFAULT_SAMPLE_RATE = 24000


@dataclass
class Level:
    mode: str                            # closed | open
    num_prompts: int
    num_warmups: int = 0
    concurrency: int | None = None       # closed loop
    rate: float | None = None            # open loop, requests/s (inf = all at once)
    max_concurrency: int | None = None   # open loop cap

    @property
    def key(self) -> str:
        if self.mode == "closed":
            return f"c={self.concurrency}"
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        return f"rate={rate}" + (f",max_c={self.max_concurrency}" if self.max_concurrency else "")

    def describe(self) -> dict:
        return {"key": self.key, "mode": self.mode, "concurrency": self.concurrency,
                "request_rate": None if self.rate is None else ("inf" if math.isinf(self.rate) else self.rate),
                "max_concurrency": self.max_concurrency, "num_prompts": self.num_prompts,
                "num_warmups": self.num_warmups}


@dataclass
class HttpOptions:
    base_url: str
    endpoint: str = "/v1/audio/speech"
    headers: dict | None = None
    timeout_s: float = 600.0
    sample_rate: int | None = None       # explicit override (else WAV header, X-Sample-Rate, server info, 24 kHz)
    server_sample_rate: int | None = None
    save_audio_dir: str | None = None
    keep_audio: bool = False             # measured requests keep their s16 PCM as `record.pcm` (quality pass)


Fire = Callable[[int, "float | None"], Awaitable[None]]


# ------------------------------------------------------------------------------------------------ load shapes
# The closed loop's user (worker) sending the current request: each worker runs as its own task, with its own copy
# of the context, so the records can name who sent them (http_turn.py pairs a user's consecutive requests).
WORKER: contextvars.ContextVar[int | None] = contextvars.ContextVar("voxflow_bench_worker", default=None)


async def closed_loop(n: int, concurrency: int, fire: Fire) -> None:
    items = iter(range(n))

    async def worker(w: int):
        WORKER.set(w)
        for i in items:              # one shared iterator: each worker takes the next prompt when it is free
            await fire(i, None)
    await asyncio.gather(*(worker(w) for w in range(max(1, min(concurrency, n)))))


def poisson_times(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s, first at 0) of a Poisson process at `rate`; all zeros for rate = inf."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def open_loop(n: int, rate: float, seed: int, max_concurrency: int | None, fire: Fire,
                    origin: float) -> None:
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(i: int, t: float):
        if sem is None:
            await fire(i, t)
        else:
            async with sem:
                await fire(i, t)
    tasks = []
    for i, t in enumerate(poisson_times(n, rate, seed)):
        delay = origin + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, t)))
    await asyncio.gather(*tasks)


async def run_level(level: Level, prompts: list[Prompt], warmups: list[Prompt], send: Callable, seed: int,
                    progress=None) -> list[RequestRecord]:
    """Warm-ups (same shape), then the measured prompts. `send(prompt, record, origin)` fills a record."""
    records: list[RequestRecord] = []
    for phase, items in (("warmup", warmups), ("measure", prompts)):
        if not items:
            continue
        origin = time.perf_counter()

        async def fire(i: int, scheduled: float | None, items=items, phase=phase, origin=origin):
            rec = RequestRecord(index=i, prompt_id=items[i].id, warmup=phase == "warmup",
                                scheduled_s=scheduled, text_chars=len(items[i].text), worker=WORKER.get())
            await send(items[i], rec, origin)
            records.append(rec)
            if progress is not None:
                progress.update(1)
        if level.mode == "closed":
            await closed_loop(len(items), level.concurrency, fire)
        else:
            await open_loop(len(items), level.rate, seed + (phase == "warmup"), level.max_concurrency, fire,
                            origin)
    records.sort(key=lambda r: (not r.warmup, r.index))
    return records


# ------------------------------------------------------------------------------------------------ one request
class HttpSender:
    """Sends one prompt and fills its RequestRecord; shared by every request of a run."""

    def __init__(self, client: HttpClient, opts: HttpOptions, spec: RequestSpec, level_key: str = ""):
        self.client, self.opts, self.spec, self.level_key = client, opts, spec, level_key
        self._bodies: dict[str, bytes] = {}
        self.headers = {"Content-Type": "application/json"}

    def body_bytes(self, prompt: Prompt) -> bytes:
        b = self._bodies.get(prompt.id)
        if b is None:
            b = self._bodies[prompt.id] = json.dumps(self.spec.body(prompt), ensure_ascii=False).encode()
        return b

    async def __call__(self, prompt: Prompt, rec: RequestRecord, origin: float) -> None:
        content = self.body_bytes(prompt)
        reader = make_reader(self.spec.stream, self.spec.response_format)
        rec.stream = self.spec.stream != "off"
        keep = self.opts.keep_audio and not rec.warmup
        audio = bytearray() if (self.opts.save_audio_dir or keep) else None
        t0 = time.perf_counter()
        rec.start_s = t0 - origin
        rec.sent_clock_s = round(time.monotonic(), 6)       # (the servers' clock, whatever perf_counter's is)
        resp = None
        try:
            async with self.client.stream("POST", self.opts.endpoint, content, self.headers) as resp:
                rec.status = resp.status
                rec.request_id = resp.headers.get("x-request-id")
                rec.server_timing_ms = parse_server_timing(resp.headers.get("server-timing"))
                if resp.status != 200:
                    body = await resp.aread()
                    rec.end_s = time.perf_counter() - t0
                    rec.error = f"http_{resp.status}"
                    rec.error_detail = body[:300].decode("utf-8", "replace")
                    return
                async for piece in resp.iter_raw():
                    t = time.perf_counter() - t0
                    if rec.first_byte_s is None:
                        rec.first_byte_s = t
                    samples = reader.feed(piece)
                    if samples:
                        rec.chunk_times_s.append(t)
                        rec.chunk_bytes.append(len(samples))
                        rec.audio_bytes += len(samples)
                        if audio is not None:
                            audio += samples
                rec.end_s = time.perf_counter() - t0
        except ReadTimeout as e:
            rec.error, rec.error_detail = "timeout", str(e)
        except ConnectError as e:
            rec.error, rec.error_detail = "connect_error", str(e)[:300]
        except ReadError as e:
            rec.error, rec.error_detail = "read_error", str(e)[:300]
        except StreamError as e:
            rec.error, rec.error_detail = "stream_error", str(e)[:300]
        except (HTTPError, OSError, ValueError) as e:
            rec.error, rec.error_detail = "client_error", _describe(e)
        finally:
            if rec.end_s is None:
                rec.end_s = time.perf_counter() - t0
        self._sample_rate(rec, reader, resp)
        if rec.error is None and rec.audio_bytes == 0:
            rec.error, rec.error_detail = "no_audio", "the response carried no audio samples"
        if audio is not None and rec.error is None:
            if keep:
                rec.pcm = audio
            if self.opts.save_audio_dir:
                self._save(rec, bytes(audio))

    def _sample_rate(self, rec: RequestRecord, reader, resp) -> None:
        hdr = resp.headers if resp is not None else {}
        ch = reader.channels or _int(hdr.get("x-channels")) or 1
        for sr, source in ((self.opts.sample_rate, "option"), (reader.sample_rate, "wav_header"),
                           (_int(hdr.get("x-sample-rate")), "x-sample-rate"),
                           (self.opts.server_sample_rate, "server_info"), (DEFAULT_SAMPLE_RATE, "assumed")):
            if sr:
                rec.sample_rate, rec.sample_rate_source, rec.channels = int(sr), source, int(ch)
                return

    def _save(self, rec: RequestRecord, pcm: bytes) -> None:
        import wave
        os.makedirs(self.opts.save_audio_dir, exist_ok=True)
        tag = "warmup" if rec.warmup else "req"
        name = f"{self.level_key.replace('=', '').replace(',', '_')}_{tag}{rec.index:05d}_{rec.prompt_id}.wav"
        with wave.open(os.path.join(self.opts.save_audio_dir, name), "wb") as w:
            w.setnchannels(rec.channels)
            w.setsampwidth(2)
            w.setframerate(rec.sample_rate)
            w.writeframes(pcm)


def parse_server_timing(value: str | None) -> dict | None:
    """`Server-Timing: api;dur=0.31, engine;dur=44.2` -> {"api": 0.31, "engine": 44.2} (ms); None when absent.
    voxflow sends it with the split of a request's first audio inside the server (routes_speech.py)."""
    out = {}
    for metric in (value or "").split(","):
        name, *params = [p.strip() for p in metric.split(";")]
        for p in params:
            key, _, dur = p.partition("=")
            if name and key.lower() == "dur":
                try:
                    out[name] = float(dur.strip('"'))
                except ValueError:
                    pass
    return out or None


def _int(x) -> int | None:
    try:
        return int(float(x)) if x not in (None, "") else None
    except ValueError:
        return None


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


# ------------------------------------------------------------------------------------------------ server info
async def server_info(client: HttpClient) -> dict:
    """GET /v1/models and /health (recorded as they answer; failures recorded, not raised)."""
    out = {}
    for name, path in (("models", "/v1/models"), ("health", "/health")):
        try:
            status, _, data = await asyncio.wait_for(client.request("GET", path), 30.0)
            try:
                body = json.loads(data)
            except ValueError:
                body = data[:500].decode("utf-8", "replace")
            out[name] = {"status": status, "body": body}
        except (HTTPError, OSError, asyncio.TimeoutError) as e:
            out[name] = {"status": None, "error": _describe(e)}
    return out


def model_card(info: dict) -> dict:
    """The first model of a /v1/models answer ({} if none)."""
    body = (info.get("models") or {}).get("body")
    if isinstance(body, dict) and isinstance(body.get("data"), list) and body["data"]:
        card = body["data"][0]
        return card if isinstance(card, dict) else {}
    return {}


async def run_http(opts: HttpOptions, spec: RequestSpec, plan: list[tuple[Level, list[Prompt], list[Prompt]]],
                   seed: int, progress_factory=None, on_level=None) -> dict:
    """Every level of the plan against one server. Returns {"server_info", "levels": [(level, records)]}.
    Objects alive now are frozen out of the garbage collector for the run: a full collection over a big heap
    (torch imported in the same process) pauses the event loop for 100+ ms and would show up as latency."""
    gc.collect()
    gc.freeze()
    try:
        return await _run_http(opts, spec, plan, seed, progress_factory, on_level)
    finally:
        gc.unfreeze()


async def _run_http(opts, spec, plan, seed, progress_factory, on_level) -> dict:
    async with HttpClient(opts.base_url, connect_timeout=min(30.0, opts.timeout_s), read_timeout=opts.timeout_s,
                          headers=opts.headers) as client:
        info = await server_info(client)
        card = model_card(info)
        if spec.served_model is None and card.get("id"):
            spec.served_model = card["id"]
        spec.use_model_task(card.get("task_types"))         # (a voxflow extension of the model card)
        if opts.server_sample_rate is None:
            opts.server_sample_rate = _int(card.get("sample_rate"))
        results = []
        for level, prompts, warmups in plan:
            sender = HttpSender(client, opts, spec, level.key)
            bar = progress_factory(level, len(prompts) + len(warmups)) if progress_factory else None
            try:
                records = await run_level(level, prompts, warmups, sender, seed, bar)
            finally:
                if bar is not None:
                    bar.close()
            results.append((level, records))
            if on_level is not None:
                on_level(level, records)
        info["health_after"] = (await server_info(client)).get("health")
    return {"server_info": info, "levels": results}
