"""The GPU across a closed-loop wave's end, step by step: what the talker's and the codec's streams ran, and where
the talker waited.

A closed-loop benchmark of equal-length requests (the 0.6B c=64 target) runs in waves: the requests of a wave end
within a few steps of each other, their final chunks drain through the codec, and the clients' next requests
arrive, are prepared and prefilled. H200 session 32's 0.6B c=64 step trace put ~100 ms of each ~1.15 s wave there,
including one 2-row step whose host waited 44 ms for its decode while the codec drained 62 final chunks (step 307 of
`2026-12-04-session32/call3/steps_0p6b_defaults.jsonl.gz`): a step trace cannot say whether the talker's kernels
ran late there or the host waited for something else. This profiles such an end:

    record:  python benchmarks/scripts/wave_end_timeline.py record MODEL_DIR CONCURRENCY OUT.json.gz [--frames N]
                 [KEY=VALUE engine args]
    report:  python benchmarks/scripts/wave_end_timeline.py report OUT.json.gz

record runs a closed loop of CONCURRENCY requests of N frames each (default 40; ignore_eos, distinct texts; on the
GPU in bf16 unless `device=cpu dtype=float32` is given, as the tests do):
wave 1 unprofiled, then the profiler (CUDA kernels and the host's steps) from 8 frames before wave 2's end until 15
steps after its last request finished. report prints per step its host time, what the step did (decode rows,
prefill tokens, codec chunks launched, requests finished) and how busy each stream was in the step's window, then
the talker stream's gaps of >= 1 ms with the codec stream's work around them (step_timeline.stalls). The profiler
records the host's ops too (to place the steps), so host times read somewhat longer than in a plain run.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timeline import DRAW, critical_path, stalls  # noqa: E402

CONV = "_conv_cl_kernel"
TEXTS = ["Hello there, this is a sentence of ordinary length for the profile.",
         "The quick brown fox jumps over the lazy dog near the river bank.",
         "Please remember to bring your umbrella, it might rain this afternoon.",
         "Our next train to the city centre leaves from platform number four."]
BEFORE_END = 8          # frames before wave 2's end at which profiling starts
AFTER_END = 15          # steps profiled after wave 2's last request finished


def record(model: str, concurrency: int, out: str, frames: int, extra: dict) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.gc_freeze import freeze_startup_objects
    from voxflow.engine.request import FinalRecord, SamplingOptions, SpeechRequest

    trace = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=concurrency, trace_steps=trace)
    cfg.update(extra)
    core = EngineCore.from_config(EngineConfig(**cfg))
    freeze_startup_objects()
    made = 0

    def add() -> None:
        nonlocal made
        core.add_request(SpeechRequest(text=f"{TEXTS[made % len(TEXTS)]} Request {made}.", voice="vivian",
                                       request_id=str(made),
                                       sampling=SamplingOptions(max_new_tokens=frames, ignore_eos=True)))
        made += 1

    for _ in range(concurrency):
        add()
    finished, prof, after = 0, None, None
    while core.has_work():
        if prof is None and finished >= concurrency and any(
                live.frames_out >= frames - BEFORE_END for live in core.live.values()):
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        with record_function(f"wave_step {core.steps + 1}"):
            outs = core.step()
        for o in outs:
            if isinstance(o, FinalRecord):
                finished += 1
                if made < 3 * concurrency:          # the closed loop: a finished request's client sends the next
                    add()
        if prof is not None and after is None and finished >= 2 * concurrency:
            after = 0
        if after is not None:
            if after >= AFTER_END:
                break
            after += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if prof is not None:
        prof.__exit__(None, None, None)
    core.shutdown()                             # (closes the step trace)
    with open(trace, encoding="utf-8") as f:
        lines = {line["step"]: line for line in map(json.loads, f)}
    os.unlink(trace)
    if prof is None:
        raise SystemExit("wave 2 never came within reach of its end: nothing profiled")
    names, kernels, steps = split_events(prof.events())
    with gzip.open(out, "wt") as f:
        json.dump({"model": model, "concurrency": concurrency, "frames": frames, "engine_args": extra,
                   "names": names, "kernels": kernels,
                   "steps": [(n, start, end, lines.get(n, {})) for n, start, end in steps]}, f)
    print(f"c={concurrency}, {frames} frames: {len(steps)} steps, {len(kernels)} kernels -> {out}")


def split_events(events) -> tuple[list[str], list[tuple], list[tuple]]:
    """The profiler's events -> (kernel names, kernels (name id, stream, start, end) in start order, steps (number,
    start, end) from the host's "wave_step N" ranges). With CUDA activity on, a record_function range also comes back
    as a device-side annotation spanning the step's work on each stream: not a kernel, so left out (it would hide
    the gaps inside a step)."""
    import torch
    cuda = torch.autograd.DeviceType.CUDA
    names: dict[str, int] = {}
    kernels, steps = [], []
    for e in events:
        if e.name.startswith("wave_step "):
            if e.device_type != cuda:
                steps.append((int(e.name.split()[1]), round(e.time_range.start, 3), round(e.time_range.end, 3)))
        elif e.device_type == cuda:
            kernels.append((names.setdefault(e.name, len(names)), getattr(e, "device_resource_id", -1),
                            round(e.time_range.start, 3), round(e.time_range.end, 3)))
    kernels.sort(key=lambda r: r[2])
    steps.sort()
    return list(names), kernels, steps


def busy(rows: list[tuple], start: float, end: float) -> float:
    """Microseconds of [start, end) during which at least one of `rows` (name, stream, start, end) ran."""
    total, frontier = 0.0, start
    for _, _, a, b in sorted(rows, key=lambda r: r[2]):
        a, b = max(a, frontier), min(b, end)
        if b > a:
            total += b - a
            frontier = b
    return total


def streams_of(data: dict) -> tuple[dict, object, object]:
    """(kernels by stream, the talker's stream: the most token draws, the codec's: the most convolutions or else
    the busiest other stream)."""
    names = data["names"]
    per_stream = defaultdict(list)
    for r in data["kernels"]:
        per_stream[r[1]].append(tuple(r))

    def count(stream, name):
        return sum(1 for r in per_stream[stream] if names[r[0]] == name)
    if not per_stream:                                  # (a CPU run: no kernels)
        return per_stream, None, None
    talker = max(per_stream, key=lambda s: (count(s, DRAW), len(per_stream[s])))
    others = [s for s in per_stream if s != talker]
    codec = max(others, key=lambda s: (count(s, CONV), sum(r[3] - r[2] for r in per_stream[s]))) if others else None
    return per_stream, talker, codec


def report(path: str) -> None:
    data = json.load(gzip.open(path, "rt"))
    per_stream, talker, codec = streams_of(data)
    print(f"{data['model']} c={data['concurrency']}, {data['frames']} frames {data['engine_args']}: talker stream "
          f"{talker}, codec stream {codec}")
    print(f"{'step':>5} {'host ms':>8} {'decode':>6} {'prefill':>7} {'codec+':>6} {'done':>4} {'talker ms':>9} "
          f"{'codec ms':>8}")
    steps = data["steps"]
    for i, (n, start, end, line) in enumerate(steps):
        window_end = steps[i + 1][1] if i + 1 < len(steps) else end
        t_busy = busy(per_stream[talker], start, window_end) / 1e3 if talker is not None else 0.0
        c_busy = busy(per_stream[codec], start, window_end) / 1e3 if codec is not None else 0.0
        print(f"{n:5d} {(window_end - start) / 1e3:8.2f} {line.get('decode', 0):6d} {line.get('prefill_tokens', 0):7d} "
              f"{line.get('codec_launched', 0):6d} {line.get('finished', 0):4d} {t_busy:9.2f} {c_busy:8.2f}")
    if talker is not None:
        stalls(critical_path(per_stream[talker]), per_stream, talker, data["names"], least_us=1000.0)


def main() -> None:
    if len(sys.argv) >= 5 and sys.argv[1] == "record":
        from voxflow.bench.offline import parse_engine_args
        rest, frames = sys.argv[5:], 40
        if "--frames" in rest:
            i = rest.index("--frames")
            frames = int(rest[i + 1])
            rest = rest[:i] + rest[i + 2:]
        record(sys.argv[2], int(sys.argv[3]), sys.argv[4], frames, parse_engine_args(rest))
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
