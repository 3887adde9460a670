"""The serving path's own cost, without a model: `voxflow serve`'s app and engine process, with a core that stands in
for the GPU by sleeping a fixed step and emitting each request's frames as a Qwen3-TTS engine would (one frame a step
per running request, chunks of 5, 10, 25 x 5, then the last 10 frames: the default layout since session 57),
driven by `voxflow bench` over HTTP at a concurrency. With a free slot taken the step it arrives, the model-less
engine's ceiling is `concurrency x frame_seconds / step_seconds` audio-s/s; what the run falls short of it is the
turnover spent in the API process, the ZeroMQ hops and the bench client (the H100 traces of session 47: ~35-44 ms a
request from the engine's final record to its replacement's prompt build over HTTP, ~16 ms offline).

    python benchmarks/scripts/api_path_load.py [--http h11|httptools] [--loop asyncio|uvloop] [--step-ms 6.3]
        [--concurrency 64] [--per-user 4] [--port 8123] [--no-gc-freeze] [--profile PATH]

Prints the bench's result line, the API process's CPU seconds a request, its event loop's lag and its GC pauses,
the engine's steps and rows in use, and its turnover (final record -> the replacement's add), ms, and that turnover
hop by hop (the server's request trace joined with the bench's records: voxflow/tools/http_turn.py); --profile
writes a cProfile of the API process's event loop.
Session 47 (an H100 host, 16 cores, 384 requests): h11 + asyncio 783.8 of 812.7 audio-s/s, 4.39 ms of API CPU a
request, turnover 20.7 ms; httptools + uvloop 796.1, 3.14 ms, 11.4 ms. Session 52 (this 2-core machine, 200
requests): 763.1, 4.35 ms, the hops through the API's loop 10.0 + 10.4 ms, yet its 10 ms timer woke late by > 5 ms
only 3.5% of the time (mean 0.87 ms): no long stalls, many short loop turns on each hop.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, Usage

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920                      # 80 ms at 24 kHz (12.5 Hz codec frames)
CHUNKS = (5, 10, 25, 25, 25, 25, 25, 10)     # 150 frames (until session 57: 5, 5, 10, 10, 25 x 4, 5 x 4)


class PacedCore:
    """Engine-core stand-in: each step sleeps `step_s` (the GPU's step) and advances every running request a
    frame; chunks leave when their frames are done. Records when each final went out and each add came in."""

    def __init__(self, step_s: float, max_rows: int, record: str):
        self.step_s = step_s
        self.record = record
        self.max_rows = max_rows
        self.running: dict[str, list] = {}     # id -> [request, frames done, chunk index, frames in chunks sent]
        self.waiting: list = []
        self.finals: list[float] = []
        self.adds: list[float] = []
        self.next_step = 0.0                    # the steps keep a fixed pace (a late one is followed by an early one)
        self.steps: list[tuple[float, int]] = []    # (start, rows)
        self.arrived: dict[str, float] = {}

    def info(self) -> dict:
        return dict(name="paced", family="paced", task="custom_voice", sample_rate=SAMPLE_RATE, voices=["vivian"],
                    languages=["auto", "chinese", "english", "japanese", "korean", "german", "french", "russian",
                               "portuguese", "spanish", "italian"], supports_instructions=False)

    def add_request(self, request) -> None:
        self.adds.append(time.monotonic())
        self.arrived[request.request_id] = self.adds[-1]        # (no prompt to build: queued as it comes)
        self.waiting.append(request)

    def abort(self, request_id: str) -> list:
        self.running.pop(request_id, None)
        self.arrived.pop(request_id, None)
        self.waiting = [r for r in self.waiting if r.request_id != request_id]
        return []

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting)}

    def create_voice(self, *args):
        raise ValueError("no voices here")

    def shutdown(self) -> None:
        with open(self.record, "w") as f:
            json.dump({"finals": self.finals, "adds": self.adds, "steps": self.steps}, f)

    def step(self) -> list:
        while self.waiting and len(self.running) < self.max_rows:
            r = self.waiting.pop(0)
            self.running[r.request_id] = [r, 0, 0, 0]
        now = time.monotonic()
        self.next_step = max(self.next_step + self.step_s, now)
        self.steps.append((now, len(self.running)))
        time.sleep(max(0.0, self.next_step - now))
        outs = []
        for rid, st in list(self.running.items()):
            r = st[0]
            st[1] += 1
            if st[1] - st[3] == CHUNKS[st[2]]:
                n = CHUNKS[st[2]]
                width = 2 if r.pcm_format == "s16" else 4
                outs.append(AudioChunk(rid, st[2], bytes(n * FRAME_SAMPLES * width), SAMPLE_RATE, n * FRAME_SAMPLES,
                                       st[3], n))
                st[2] += 1
                st[3] += n
            if st[2] == len(CHUNKS):
                del self.running[rid]
                outs.append(FinalRecord(rid, FinishReason.LENGTH, Usage(10, st[3], st[3] * FRAME_SAMPLES
                                                                         / SAMPLE_RATE),
                                        arrived_at=self.arrived.pop(rid), ttfp_parts={"prepare": 0.0}))
                self.finals.append(time.monotonic())
        return outs


def build_paced_core(step_s: float, max_rows: int, record: str) -> PacedCore:
    return PacedCore(step_s, max_rows, record)


def turnover_ms(finals: list[float], adds: list[float]) -> list[float]:
    """Each final record's time to the next add not yet matched (a closed loop: each final brings one add)."""
    out, j = [], 0
    for f in finals:
        while j < len(adds) and adds[j] < f:
            j += 1
        if j == len(adds):
            break
        out.append((adds[j] - f) * 1e3)
        j += 1
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(args) -> None:
    import uvicorn

    from voxflow.api.app import create_app
    from voxflow.api.state import ServerSettings
    from voxflow.api.uvicorn_server import ShutdownAwareServer
    from voxflow.engine.process import ProcessEngineClient

    engine = ProcessEngineClient(functools.partial(build_paced_core, args.step_ms / 1e3, args.concurrency,
                                                  args.record))
    app = create_app(engine, ServerSettings(model_name="paced", max_concurrent_requests=args.concurrency * 2,
                                            trace_requests=args.record + ".requests.jsonl"))
    if args.profile:                # the API process's own Python, cProfile'd (its event loop's thread)
        import cProfile
        import signal
        # uvicorn re-raises the SIGTERM it handled once it has shut down: exit through Python, not the default
        # handler, so that the statistics are written
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        prof = cProfile.Profile()
        prof.enable()
    try:                            # (as `voxflow serve` runs it: its startup objects frozen unless --no-gc-freeze)
        config = uvicorn.Config(app, host="127.0.0.1", port=args.port, http=args.http, loop=args.loop,
                                log_level="warning")
        ShutdownAwareServer(config, app.state.vox.admission, freeze_gc=not args.no_gc_freeze).run()
    finally:
        if args.profile:
            prof.disable()
            prof.dump_stats(args.profile)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http", default="h11", choices=["h11", "httptools"])
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    p.add_argument("--step-ms", type=float, default=6.3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--per-user", type=int, default=4)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--no-gc-freeze", action="store_true", help="as voxflow serve --no-gc-freeze")
    p.add_argument("--profile", metavar="PATH", help="cProfile the API process, statistics to PATH (pstats)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args)
        return
    out = tempfile.mkdtemp()
    record = os.path.join(out, "turnover.json")
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--record", record, *sys.argv[1:]])
    try:
        base = f"http://127.0.0.1:{args.port}"
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/health", timeout=1).status == 200:
                    break
            except Exception:
                time.sleep(0.1)
        cmd = [sys.executable, "-m", "voxflow.bench", "--base-url", base, "--concurrency", str(args.concurrency),
               "--num-prompts", str(args.concurrency * args.per_user), "--num-warmups", "8", "--no-progress",
               "--no-plots", "--unique-prompts", "--max-new-tokens", "151", "--ignore-eos", "--voice", "vivian",
               "--output", os.path.join(out, "r.json.gz"), "--label", f"paced-{args.http}-{args.loop}"]
        start_scrape = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()   # (startup left out)
        cpu0 = _cpu_seconds(server.pid)
        res = subprocess.run(cmd, capture_output=True, text=True)
        cpu = _cpu_seconds(server.pid) - cpu0
        lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("| c=") or "TTFP went" in ln]
        print("\n".join(lines) or res.stdout[-3000:] + res.stderr[-3000:])
        n = args.concurrency * args.per_user + 8
        print(f"API process CPU: {cpu:.2f} s for {n} requests, {cpu / n * 1e3:.2f} ms a request")
        from voxflow.tools.loop_lag import format_gc_pauses, format_lag
        scrape = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        print(format_lag(scrape, since=start_scrape))
        print(format_gc_pauses(scrape, since=start_scrape))
    finally:
        server.terminate()
        server.wait()
    if os.path.exists(record):
        with open(record) as f:
            rec = json.load(f)
        t = turnover_ms(sorted(rec["finals"]), sorted(rec["adds"]))
        steps = rec["steps"]
        full = next(i for i, (_, rows) in enumerate(steps) if rows == args.concurrency)
        n = len(steps) - full - 1                            # steps with a successor
        span = steps[-1][0] - steps[full][0]
        rows = sum(r for _, r in steps[full:-1])
        print(f"engine: {n + 1} steps from the first full one, mean {span / n * 1e3:.2f} ms; rows in use "
              f"{rows / (args.concurrency * n) * 100:.1f}%")
        from voxflow.tools import http_turn
        print(http_turn.format_summary(http_turn.turn_summary(
            http_turn.load_result_records(os.path.join(out, "r.json.gz")),
            http_turn.load_trace(record + ".requests.jsonl"))))
        if t:
            print(f"turnover (final -> next add) ms: median {statistics.median(t):.2f} mean {statistics.mean(t):.2f} "
                  f"p90 {statistics.quantiles(t, n=10, method='inclusive')[-1]:.2f} (n={len(t)}); ceiling "
                  f"{args.concurrency * FRAME_SAMPLES / SAMPLE_RATE / (args.step_ms / 1e3):.1f} audio-s/s")


if __name__ == "__main__":
    main()
