"""Results tables from committed `voxflow bench` result files (and their PNG plots): the README's latest runs and
the rows of benchmarks/results/h200/README.md.

    python benchmarks/scripts/results_table.py benchmarks/results/h200/2026-11-29-*/ [--plots]

Results are read as `voxflow bench` wrote them: .json, or .json.gz (how the committed ones are kept).

One row per measured level: run folder, label and stack tags, model, level, first-packet latency p50 / p99,
RTF (mean; lower is faster), audio seconds per wall second, share of streams without underrun, peak GPU memory
of the engine (its total where the result recorded it, else the peak of its tensors). `--plots` (re)writes each
result's PNGs beside it.
"""
from __future__ import annotations

import glob
import os
import sys

from voxflow.bench.report import read_json, result_stem


def _model(result: dict) -> str:
    target = result.get("target") or {}
    # offline runs: the engine's model folder; HTTP runs: the first model the server lists; else the target's model
    path = ((target.get("engine") or {}).get("config") or {}).get("model")
    if not path:
        listed = (((target.get("server_info") or {}).get("models") or {}).get("body") or {}).get("data") or [{}]
        path = listed[0].get("id") or target.get("model") or ""
    name = os.path.basename(str(path).rstrip("/"))
    return {"real-1.7b": "1.7B", "real-0.6b": "0.6B"}.get(name, name or "?")


def _pct(rate) -> str:
    return "—" if rate is None else f"{rate * 100:.0f}%"      # not a streamed run (the official package)


def _memory(result: dict) -> str:
    """The engine's peak total (allocator reservation + CUDA context and modules: engine/gpu_memory.py) where the
    result recorded it (offline: the engine's stats; HTTP: the server's /health after the run); older results only
    recorded the peak of allocated tensors, marked as such."""
    target = result.get("target") or {}
    stats = (target.get("engine") or {}).get("stats") or {}
    health = ((((target.get("server_info") or {}).get("health_after") or {}).get("body") or {}).get("engine") or {})
    total = stats.get("peak_gpu_memory_total_bytes") or health.get("peak_gpu_memory_total_bytes")
    if total:
        return f"{total / 2**30:.1f} GiB total"
    peak = stats.get("peak_gpu_memory_bytes") or (stats.get("startup") or {}).get("peak_gpu_memory_bytes")
    return f"{peak / 2**30:.1f} GiB tensors" if peak else "—"


def rows(paths: list[str]) -> list[str]:
    out = ["| run | label | model | level | TTFP p50 / p99 (ms) | RTF | audio-s/s | no underrun | peak GPU mem |",
           "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        result = read_json(path)
        if "levels" not in result:          # not a bench result (e.g. a saved /health answer)
            continue
        mem = _memory(result)
        for level in result["levels"]:
            s = level["summary"]
            cont = s.get("continuity") or {}
            out.append(f"| {os.path.basename(os.path.dirname(path))} | {result.get('label') or '—'} | {_model(result)} "
                       f"| {level['level'].get('key', '?')} | {s['ttfp_s']['p50'] * 1e3:.0f} / {s['ttfp_s']['p99'] * 1e3:.0f} "
                       f"| {s['rtf']['mean']:.3f} | {s['audio_throughput']:.1f} "
                       f"| {_pct(cont.get('no_underrun_rate'))} | {mem} |")
    return out


def main(argv: list[str]) -> int:
    plots = "--plots" in argv
    folders = [a for a in argv if a != "--plots"]
    paths = sorted(p for d in folders for pattern in ("*.json", "*.json.gz")
                   for p in glob.glob(os.path.join(d, pattern)))
    print("\n".join(rows(paths)))
    if plots:
        from voxflow.bench.plots import write_plots
        for p in paths:
            result = read_json(p)
            if "levels" in result:
                write_plots(result, result_stem(p))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
