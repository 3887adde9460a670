"""The critical path of an engine step, kernel by kernel: where a graph replay's wall time goes.

CUPTI's per-kernel durations overlap under programmatic dependent launch (a kernel starts early and waits), so
their sum is not the step. This tool keeps each kernel's start and end on the step's stream and charges every
microsecond of the stream's busy span to exactly one kernel (the one that extends it), plus the idle gaps between
kernels to the kernel after the gap:

    exposed_i = max(0, end_i - max(start_i, frontier))      gap_i = max(0, start_i - frontier)
    frontier  = max(end_0 .. end_{i-1})

so that sum(exposed + gap) is the stream's wall time.

    record:  python benchmarks/scripts/step_timeline.py record MODEL_DIR CONCURRENCY OUT.json.gz [--stagger]
                 [KEY=VALUE engine args]
    report:  python benchmarks/scripts/step_timeline.py report OUT.json.gz [--sequence]

record profiles 30 graph-replayed steps (profile_step.py's engine) and writes each kernel's (name, stream, start,
end) in microseconds. report prints, per kernel name, launches a step, CUPTI's mean duration, the exposed and gap
time a step; then the step split at each token draw (select_tokens: the code predictor's 15 draws and the c0
draw), the step stream's idle gaps of >= 100 us with what the other streams ran meanwhile, each kernel's charge
alone and while another stream's kernel runs (the codec's, beside the talker: `beside`), and with --sequence every
kernel of one step in order. (The window of that one step starts mid-step, at whatever kernel the middle of
the trace holds; the segments start after a draw.)
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import sys
from collections import defaultdict

STEPS = 30
DRAW = "_select_tokens_kernel"


def record(model: str, concurrency: int, out: str, stagger: bool, extra: dict) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from profile_step import engine, timed
    core = engine(model, concurrency, True, extra, stagger)
    ms = timed(core, 20)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timed(core, STEPS)
    names: dict[str, int] = {}
    rows = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((names.setdefault(e.name, len(names)), getattr(e, "device_resource_id", -1),
                         round(e.time_range.start, 3), round(e.time_range.end, 3)))
    rows.sort(key=lambda r: r[2])
    with gzip.open(out, "wt") as f:
        json.dump({"model": model, "concurrency": concurrency, "engine_args": extra, "steps": STEPS,
                   "step_ms": ms, "names": list(names), "kernels": rows}, f)
    print(f"c={concurrency}: {ms:.3f} ms a step; {len(rows)} kernels in {STEPS} steps -> {out}")


def critical_path(rows: list[tuple]) -> list[tuple[int, float, float, float, float]]:
    """(name id, start, end, exposed, gap) of each kernel of one stream, in start order."""
    out, frontier = [], None
    for name, _, start, end in rows:
        if frontier is None:
            frontier = start
        gap = max(0.0, start - frontier)
        exposed = max(0.0, end - max(start, frontier))
        frontier = max(frontier, end)
        out.append((name, start, end, exposed, gap))
    return out


def report(path: str, sequence: bool) -> None:
    data = json.load(gzip.open(path, "rt"))
    names, steps = data["names"], data["steps"]
    per_stream = defaultdict(list)
    for r in data["kernels"]:
        per_stream[r[1]].append(r)
    main = max(per_stream, key=lambda s: len(per_stream[s]))
    path_rows = critical_path(per_stream[main])
    wall = max(r[2] for r in path_rows) - path_rows[0][1]          # the last end, not the last-started kernel's
    print(f"{data['model']} c={data['concurrency']} {data['engine_args']}: timed step {data['step_ms']:.3f} ms; "
          f"stream {main}: {len(path_rows) / steps:.0f} kernels a step, {wall / steps / 1e3:.3f} ms a step of wall "
          f"time, {sum(r[3] for r in path_rows) / steps / 1e3:.3f} exposed + "
          f"{sum(r[4] for r in path_rows) / steps / 1e3:.3f} idle; other streams: "
          + ", ".join(f"{s}: {len(v) / steps:.0f} kernels, {sum(r[3] - r[2] for r in v) / steps / 1e3:.3f} ms"
                      for s, v in per_stream.items() if s != main))
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for name, start, end, exposed, gap in path_rows:
        a = agg[name]
        a[0] += 1
        a[1] += end - start
        a[2] += exposed
        a[3] += gap
    print(f"{'us a step':>10} {'exposed':>8} {'gap':>7} {'n':>6} {'CUPTI us':>9}  kernel")
    for name, (n, dur, exp, gap) in sorted(agg.items(), key=lambda kv: -(kv[1][2] + kv[1][3])):
        print(f"{(exp + gap) / steps:10.1f} {exp / steps:8.1f} {gap / steps:7.1f} {n / steps:6.1f} {dur / n:9.2f}  "
              f"{names[name][:100]}")
    # One step's segments, cut after each draw: the code predictor's steps and the rest.
    draw = names.index(DRAW) if DRAW in names else -1
    per_step = len(path_rows) // steps
    one = path_rows[len(path_rows) // 2 - per_step // 2:][:per_step * 2]
    starts = [i for i, r in enumerate(one) if r[0] == draw]
    if len(starts) >= 2:
        draws_a_step = sum(1 for r in path_rows if r[0] == draw) // steps
        first = starts[0] + 1
        seg_rows = one[first:]
        print(f"\nsegments between draws ({draws_a_step} draws a step), one step from the middle of the trace:")
        seg, count, total = [], 0, 0.0
        for r in seg_rows:
            seg.append(r)
            if r[0] == draw:
                t = sum(x[3] + x[4] for x in seg)
                total += t
                kinds = defaultdict(int)
                for x in seg:
                    kinds[names[x[0]][:28]] += 1
                print(f"  {t:8.1f} us {len(seg):4d} kernels  " + ", ".join(f"{k} x{v}" for k, v in kinds.items()))
                seg = []
                count += 1
                if count == draws_a_step:
                    break
        print(f"  {total:8.1f} us in all")
    stalls(path_rows, per_stream, main, names)
    beside(path_rows, per_stream, main, names, steps)
    if sequence:
        print("\none step in order (exposed / gap / CUPTI duration, us):")
        for name, start, end, exposed, gap in one[:per_step]:
            print(f"  {exposed:7.2f} {gap:6.2f} {end - start:7.2f}  {names[name][:90]}")


def stalls(path_rows: list[tuple], per_stream: dict, main, names: list[str], least_us: float = 100.0) -> None:
    """The step stream's idle gaps of at least `least_us` (after its first kernel), each with what the other streams
    ran meanwhile: a gap that ends just after another stream's work ends is a wait for that work (a shared queue or
    an ordering), not an idle host."""
    found = [(i, r) for i, r in enumerate(path_rows) if i > 0 and r[4] >= least_us]
    if not found:
        return
    print(f"\nstep-stream gaps of >= {least_us:.0f} us, and the other streams around them:")
    for i, (name, start, _end, _exposed, gap) in found:
        gap_start = start - gap
        line = (f"  {gap:7.1f} us at {gap_start - path_rows[0][1]:9.1f}: {names[path_rows[i - 1][0]][:40]} -> "
                f"{names[name][:40]}")
        for stream, rows in per_stream.items():
            if stream == main:
                continue
            during = [r for r in rows if r[3] > gap_start and r[2] < start]
            if during:
                last_end = max(r[3] for r in during)
                line += (f"; stream {stream}: {len(during)} kernels, its last ends {start - last_end:.1f} us before "
                         f"the gap does")
        print(line)


def busy_spans(rows: list[tuple]) -> list[tuple[float, float]]:
    """The union of the rows' [start, end] intervals, as disjoint spans in order."""
    spans: list[list[float]] = []
    for _, _, start, end in sorted(rows, key=lambda r: r[2]):
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(a, b) for a, b in spans]


def overlaps(spans: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether [start, end] meets one of the disjoint, ordered spans."""
    i = bisect.bisect_right(spans, (end, float("inf"))) - 1     # the last span starting at or before `end`
    return i >= 0 and spans[i][1] > start


def beside(path_rows: list[tuple], per_stream: dict, main, names: list[str], steps: int, top: int = 15) -> None:
    """Each step-stream kernel's charge on the step's wall (exposed + the gap before it) when no other stream's
    kernel runs during it and when one does, by kernel name: whether running beside the codec costs each kernel a
    fixed time (then fewer kernels would pay) or a share of its length (then the kernels' work is what is shared)."""
    spans = busy_spans([r for s, rows in per_stream.items() if s != main for r in rows])
    if not spans:
        return
    agg = defaultdict(lambda: [0, 0.0, 0, 0.0])          # alone: n, charge; beside: n, charge
    for name, start, end, exposed, gap in path_rows:
        a = agg[name]
        k = 2 if overlaps(spans, start - gap, end) else 0
        a[k] += 1
        a[k + 1] += exposed + gap
    both = {n: a for n, a in agg.items() if a[0] and a[2]}
    n_alone, n_beside = sum(a[0] for a in agg.values()), sum(a[2] for a in agg.values())

    def more(a) -> float:           # what a name's kernels beside charged over the same count alone
        return a[3] - a[2] * a[1] / a[0]
    extra = sum(more(a) for a in both.values())
    print(f"\nbeside other streams' kernels: {n_beside} of {n_alone + n_beside} step-stream kernels; those of a name "
          f"seen both ways charge {extra / max(1, sum(a[2] for a in both.values())):.2f} us more each beside "
          f"({extra / steps / 1e3:.3f} ms a step)")
    print(f"{'alone us':>9} {'beside us':>10} {'n beside':>9} {'extra us a step':>16}  kernel")
    for name, a in sorted(both.items(), key=lambda kv: -more(kv[1]))[:top]:
        na, ca, nb, cb = a
        print(f"{ca / na:9.2f} {cb / nb:10.2f} {nb:9d} {more(a) / steps:16.1f}  {names[name][:90]}")


def main() -> None:
    if len(sys.argv) >= 5 and sys.argv[1] == "record":
        from voxflow.bench.offline import parse_engine_args
        rest = sys.argv[5:]
        record(sys.argv[2], int(sys.argv[3]), sys.argv[4], "--stagger" in rest,
               parse_engine_args([a for a in rest if a != "--stagger"]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2], "--sequence" in sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
