"""Where a served run's wall time went, from its per-step trace (`voxflow serve --trace-steps PATH`, or
`--engine-arg trace_steps=PATH` on an offline `voxflow bench`; step_trace.py has the line format).

    python -m voxflow.tools.step_trace_summary TRACE.jsonl[.gz] [--full-rows N] [--from-start]

A step's wall time is the time from its start to the next step's start. Steps are grouped by whether the batch was
full (decode rows == N, by default the most rows any step decoded), partial or idle (no decode, no prefill: the
talker had nothing to do), whether the step launched codec work, whether it prefilled, and whether codec calls were
still in flight when it started ("codec running": on a GPU the codec's kernels share the SMs with the step's; traces
with `codec_in_flight`, from session 25 on). The span starts at the
first full step (unless --from-start), so warm-up requests and the first wave's ramp are left out; the last step,
which has no successor, is not counted. Printed: a markdown table (steps, ms, share of the span, median and mean ms
a step), the mean decode rows a step, the rows in use over the span weighted by time (the row capacity a
closed-loop run used; pauses of > 1 s with nothing to do, between a server's bench runs, are left out, but a later
run's warm-up requests, a few rows for a second, still count), the engine thread's prompt-build time (and the part
of it built while the talker's GPU work had run out: builds_before_an_idle_gpu), the median
host phases of the full steps without codec or prefill work, and
the prefill steps' share, tokens and wall time per 1,000 prompt tokens (a wave arriving together prefills in a few
large steps), and what the requests' turnover cost (turnover_summary: the run against all-full steps at the full
steps' pace, and where a replaced row's time went: the last chunk, the way back to a new request, its prefill).
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from dataclasses import dataclass, field


PAUSE_MS = 1000.0


def read_trace(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class Group:
    durations_ms: list[float] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.durations_ms)


def step_kind(step: dict, full_rows: int, codec_running: bool = False) -> str:
    rows = step.get("decode", 0)
    # "talker idle": no decode, no prefill -- e.g. a closed-loop wave's end, the codec draining final chunks while
    # no request is left to decode and the next ones have not arrived
    kind = "full" if rows >= full_rows else "partial" if rows or step.get("prefill") else "talker idle"
    if step.get("codec_launched"):
        kind += " + codec"
    if step.get("prefill"):
        kind += " + prefill"
    if codec_running:
        kind += " + codec running"
    return kind


def kinds(steps: list[dict], full_rows: int) -> list[str]:
    """Each step's kind; "codec running" from the line before (its codec calls still in flight at its end)."""
    return [step_kind(s, full_rows, i > 0 and steps[i - 1].get("codec_in_flight", 0) > 0)
            for i, s in enumerate(steps)]


def summarize(steps: list[dict], full_rows: int | None = None, from_start: bool = False) -> dict:
    """{"full_rows", "span_ms", "steps", "mean_rows", "groups": {kind: Group}, "host_ms": {phase: median}}."""
    if len(steps) < 2:
        raise ValueError("a trace needs at least two steps")
    full_rows = full_rows or max(s.get("decode", 0) for s in steps)
    kind = kinds(steps, full_rows)              # (from the whole trace: a step's kind needs the line before)
    before_first = None
    if not from_start:
        first = next((i for i, s in enumerate(steps) if s.get("decode", 0) >= full_rows), None)
        if first is None:
            raise ValueError(f"no step decoded {full_rows} rows")
        before_first = steps[first - 1] if first > 0 else None
        steps, kind = steps[first:], kind[first:]
    if len(steps) < 2:
        raise ValueError("fewer than two steps from the first full one")
    walls = [(s, (nxt["t"] - s["t"]) * 1e3) for s, nxt in zip(steps, steps[1:])]       # each counted step's wall
    groups: dict[str, Group] = {}
    for (_, ms), k in zip(walls, kind):
        groups.setdefault(k, Group()).durations_ms.append(ms)
    counted = steps[:-1]
    plain = [s for s, k in zip(counted, kind) if k == "full"]
    phases = sorted({k for s in plain for k in s.get("ms", {})})
    span_ms = (steps[-1]["t"] - steps[0]["t"]) * 1e3
    row_ms = sum(s.get("decode", 0) * ms for s, ms in walls)
    # a server's trace spans its bench runs and the pauses between them: a talker-idle step that lasted longer than
    # PAUSE_MS is such a pause, left out of the occupancy's span
    pauses = [ms for (_, ms), k in zip(walls, kind) if k.startswith("talker idle") and ms > PAUSE_MS]
    busy_ms = span_ms - sum(pauses)
    return {"full_rows": full_rows, "span_ms": span_ms, "steps": len(counted),
            "mean_rows": sum(s.get("decode", 0) for s in counted) / len(counted), "groups": groups,
            # decode rows weighted by each step's wall time, over full_rows for the whole span: the row capacity used
            # (idle and partial steps, and long prefill steps, count against it; a closed-loop run's throughput moves
            # with it)
            "row_occupancy": row_ms / (full_rows * busy_ms) if busy_ms > 0 else 0.0, "pauses": len(pauses),
            # host ms building prompts (the engine thread), and the part of it the GPU may have waited for
            "prepare_ms": sum(s.get("prepare_ms", 0.0) for s in counted),
            "prepare_idle_ms": builds_before_an_idle_gpu(counted, before_first),
            # host ms of the step's intake of arrivals while it waited for its decode (intake_while_waiting): builds
            # that ran beside the GPU's work, not between steps
            "intake_ms": sum(s.get("ms", {}).get("intake", 0.0) for s in counted),
            "host_ms": {p: statistics.median(s.get("ms", {}).get(p, 0.0) for s in plain) for p in phases},
            "prefill": prefill_summary(steps), "turnover": turnover_summary(steps, full_rows),
            "stalls": stall_summary(walls, kind)}


# A served step longer than this (wall ms) is a stall every stream felt: full steps take 5-15 ms.
STALL_MS = 50.0


def stall_summary(walls: list[tuple[dict, float]], kind: list[str]) -> list[dict]:
    """The steps that took over STALL_MS (pauses between bench runs left out), with what the trace says of them:
    its longest host phase and the usual suspects (graph captures, Triton compiles, eager prefill forwards, the
    garbage collector, and on a GPU the allocator's retries and device allocations and the driver's stack growth)."""
    out = []
    for (s, ms), k in zip(walls, kind):
        if ms <= STALL_MS or k.startswith("talker idle"):
            continue
        phases = s.get("ms", {})
        phase = max(phases, key=phases.get) if phases else None
        out.append({"step": s.get("step"), "wall_ms": ms, "phase": phase,
                    "phase_ms": phases.get(phase, 0.0) if phase else 0.0,
                    # (None: a trace older than the field, session 63)
                    **{key: s.get(key) for key in ("prefill", "prefill_tokens", "capture_ms", "compiles",
                                                   "compile_ms", "prefill_eager_runs", "gc_ms", "alloc_retries",
                                                   "cuda_mallocs", "stack_grown_bytes")}})
    return out


# A step's wait for the decode before it shorter than this: that decode had finished before the host came to read
# it, so the GPU had run out of queued talker work (a decode step takes milliseconds).
DONE_BEFORE_READ_MS = 0.3


def builds_before_an_idle_gpu(counted: list[dict], before_first: dict | None) -> float:
    """Host ms of prompt builds (`prepare_ms`: built between the step before and this one) in the counted steps that
    found the decode before them already done (collect_decode < DONE_BEFORE_READ_MS): while those builds ran, the
    talker's queued GPU work ran out, so they bound the time the GPU waited on the host's builds (session 59: at
    0.6B c=64 over HTTP, waves of ~20-30 arrivals built in one go while ~8 rows were left decoding).
    A step's builds taken mid-step (`ms.intake`, EngineConfig.intake_while_waiting: inside the wait for its decode,
    whose read then starts after them) are not builds between steps: they are left out, up to the intake's time.
    before_first: the step before the first counted one (None: there is none)."""
    total = 0.0
    for before, step in zip([before_first] + counted[:-1], counted):
        ms = step.get("ms", {})
        between = step.get("prepare_ms", 0.0) - ms.get("intake", 0.0)
        if (before is not None and before.get("decode", 0) > 0 and between > 0
                and ms.get("collect_decode", DONE_BEFORE_READ_MS) < DONE_BEFORE_READ_MS):
            total += between
    return total


def turnover_summary(steps: list[dict], full_rows: int) -> dict | None:
    """What a closed-loop run lost to its requests' turnover, from the first full step to the last one that added a
    request (the run's final drain left out). Ideal: every step full at the full steps' mean wall (steps with no
    prefill in them or the step before). {"window_ms", "steady_ms", "loss_ms" (the window against the ideal for the
    frames it made), "idle_rows_ms" (of it: rows without a decode, at the steady rate), "slow_steps_ms" (the rest:
    steps longer than steady, prefill steps above all), "slow_steps_by_kind_ms" (that sum by the steps' kind:
    "prefill" (a step that prefills or follows one), "partial" (fewer rows, no prefill), "full"), "replaced"
    (requests added), and per replacement the row-ms a row spent "tail" (its talker done, its final record not out:
    the last chunk's codec work), "turn" (final record out, its replacement not yet added: the client, the API
    process, the engine's intake and the prompt build) and "prefill" (added, not yet decoding)}. None without the
    fields (`running`, `added`, `finished`) or a full step free of prefill."""
    if not steps or any(k not in steps[0] for k in ("running", "added", "finished")):
        return None
    last_add = max((i for i, s in enumerate(steps) if s["added"] > 0), default=None)
    if last_add is None or last_add + 2 > len(steps):
        return None
    w = steps[:last_add + 2]
    walls = [(nxt["t"] - s["t"]) * 1e3 for s, nxt in zip(w, w[1:])]
    counted = w[:-1]
    # each counted step's kind: it prefills or follows a prefill; fewer rows without (a wave's edge: its last rows,
    # the codec's final and first chunks); full and free of prefill (their mean wall is the steady pace)
    kinds = ["prefill" if s.get("prefill") or (i and counted[i - 1].get("prefill"))
             else "partial" if s.get("decode", 0) < full_rows else "full" for i, s in enumerate(counted)]
    clean = [ms for kind, ms in zip(kinds, walls) if kind == "full"]
    if not clean:
        return None
    steady = statistics.mean(clean)
    window = sum(walls)
    frames = sum(s.get("decode", 0) for s in counted)
    idle = sum((full_rows - s.get("decode", 0)) * steady / full_rows for s in counted)
    phases = dict.fromkeys(("tail", "turn", "prefill"), 0.0)
    ended = finished = 0
    running = counted[0]["running"]
    for s, ms in zip(counted[1:], walls[1:]):
        ended += running + s["added"] - s["running"]        # rows whose talker finished in this step
        running = s["running"]
        finished += s["finished"]
        free = full_rows - s["running"]
        tail = min(free, max(0, ended - finished))
        phases["tail"] += tail * ms
        phases["turn"] += max(0, free - tail) * ms
        phases["prefill"] += max(0, s["running"] - s.get("decode", 0)) * ms
    replaced = sum(s["added"] for s in counted[1:])
    loss = window - frames * steady / full_rows
    # the slower steps (the sum of wall - steady, = loss - idle) by kind (the full ones' share is ~0 by construction)
    slow_by = dict.fromkeys(("prefill", "partial", "full"), 0.0)
    for kind, ms in zip(kinds, walls):
        slow_by[kind] += ms - steady
    return {"window_ms": window, "steady_ms": steady, "loss_ms": loss, "idle_rows_ms": idle,
            "slow_steps_ms": loss - idle, "slow_steps_by_kind_ms": slow_by, "replaced": replaced,
            "per_replacement_row_ms": {k: v / replaced for k, v in phases.items()} if replaced else {}}


def prefill_summary(steps: list[dict]) -> dict | None:
    """The counted steps that prefilled: {"steps", "prompts", "tokens", "wall_ms" (their wall time), "host_ms" (the
    host's prefill phase: on a GPU it returns once the work is queued, so a large value means it waited),
    "ms_per_1k_tokens": [min, median, max] of each step's wall ms per 1,000 prompt tokens (steps of >= 256)}.
    A wave of requests arriving together prefills in a few such steps. None: no step prefilled."""
    rows = [(s, (nxt["t"] - s["t"]) * 1e3) for s, nxt in zip(steps, steps[1:]) if s.get("prefill", 0) > 0]
    if not rows:
        return None
    per_1k = sorted(ms * 1e3 / s["prefill_tokens"] for s, ms in rows if s.get("prefill_tokens", 0) >= 256)
    return {"steps": len(rows), "prompts": sum(s["prefill"] for s, _ in rows),
            "tokens": sum(s.get("prefill_tokens", 0) for s, _ in rows), "wall_ms": sum(ms for _, ms in rows),
            "host_ms": sum(s.get("ms", {}).get("prefill", 0.0) for s, _ in rows),
            "ms_per_1k_tokens": [per_1k[0], statistics.median(per_1k), per_1k[-1]] if per_1k else None}


def _stall_line(st: dict) -> str:
    def v(key, fmt="{}"):
        return "?" if st[key] is None else fmt.format(st[key])
    return (f"stall: step {st['step']} took {st['wall_ms']:.1f} ms ({st['phase']} {st['phase_ms']:.1f} ms; "
            f"{v('prefill')} prefill chunks, {v('prefill_tokens')} tokens; graphs captured {v('capture_ms', '{:.1f}')} "
            f"ms, Triton compiles {v('compiles')} ({v('compile_ms', '{:.1f}')} ms), eager prefill forwards "
            f"{v('prefill_eager_runs')}, gc {v('gc_ms', '{:.1f}')} ms, allocator retries {v('alloc_retries')}, "
            f"cudaMallocs {v('cuda_mallocs')}, stack grown {v('stack_grown_bytes')} bytes)")


def render(summary: dict) -> str:
    span = summary["span_ms"]
    lines = [f"span {span:.0f} ms, {summary['steps']} steps from the first full one ({summary['full_rows']} rows); "
             f"mean decode rows a step {summary['mean_rows']:.1f}; rows in use over the span (time-weighted"
             + (f", {summary['pauses']} pauses of > {PAUSE_MS / 1e3:g} s left out" if summary["pauses"] else "")
             + f") {summary['row_occupancy']:.1%}; prompt builds {summary['prepare_ms']:.1f} ms on the engine thread"
             + (f" ({summary['prepare_idle_ms']:.1f} of them in steps that found the decode before them done: the "
                "GPU's wait on builds is at most that)" if summary.get("prepare_idle_ms") else "")
             + (f"; {summary['intake_ms']:.1f} ms of intake mid-step, beside the GPU's work (intake_while_waiting)"
                if summary.get("intake_ms") else ""),
             "",
             "| steps | count | ms | share | median ms | mean ms |", "|---|---|---|---|---|---|"]
    for kind, g in sorted(summary["groups"].items(), key=lambda kv: -kv[1].total):
        lines.append(f"| {kind} | {len(g.durations_ms)} | {g.total:.1f} | {g.total / span:.1%} | "
                     f"{statistics.median(g.durations_ms):.2f} | {statistics.mean(g.durations_ms):.2f} |")
    if summary["host_ms"]:
        lines += ["", "host ms by phase (median) of the full steps without codec or prefill work: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in summary["host_ms"].items())]
    pf = summary.get("prefill")
    if pf:
        rate = pf["ms_per_1k_tokens"]
        lines += ["", f"prefill: {pf['steps']} steps ({pf['wall_ms'] / span:.1%} of the span, {pf['wall_ms']:.1f} ms; "
                  f"host prefill phase {pf['host_ms']:.1f} ms), {pf['prompts']} prompt chunks, {pf['tokens']} tokens"
                  + (f"; wall ms per 1,000 tokens min / median / max {rate[0]:.2f} / {rate[1]:.2f} / {rate[2]:.2f}"
                     if rate else "")]
    if summary.get("stalls"):
        lines.append("")
        lines += [_stall_line(st) for st in summary["stalls"]]
    to = summary.get("turnover")
    if to:
        per = to["per_replacement_row_ms"]
        lines += ["", f"turnover (to the last add, {to['window_ms']:.0f} ms): full steps free of prefill "
                  f"{to['steady_ms']:.3f} ms; lost against all-full steps at that pace {to['loss_ms']:.0f} ms "
                  f"({to['loss_ms'] / to['window_ms']:.1%}): idle rows {to['idle_rows_ms']:.0f}, slower steps "
                  f"{to['slow_steps_ms']:.0f} ("
                  + ", ".join(f"{k} {round(v):+d}" for k, v in to["slow_steps_by_kind_ms"].items())
                  + f"); {to['replaced']} requests replaced, row-ms each: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in per.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a step trace (.jsonl or .jsonl.gz)")
    ap.add_argument("--full-rows", type=int, default=None, help="decode rows of a full batch (default: the most seen)")
    ap.add_argument("--from-start", action="store_true", help="count from the first step, warm-up included")
    args = ap.parse_args(argv)
    print(render(summarize(read_trace(args.trace), args.full_rows, args.from_start)))


if __name__ == "__main__":
    main()
