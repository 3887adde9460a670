"""`voxflow bench compare a.json b.json [...]`: results side by side, with ratios.

Levels are matched by key (c=4, rate=2, batch=8; `--align index` pairs them by position instead, e.g. an
official batch run against a voxflow concurrency level). Every later file is compared with the first (the
baseline) and, with three or more files (stacked configurations: baseline, +batching, +CUDA graphs, ...), with the
one before it, so each step's contribution shows. Ratios are oriented so that > 1 always means better than the
reference: latency / RTF ratios are reference / this ("× faster"), throughput ratios this / reference.
Throughput depends on the output length: when mean audio durations differ by more than 10 % a warning says so.
"""
from __future__ import annotations

import os

from .report import load_result

# (label, getter, unit scale, decimals, direction: "lower" | "higher" | None)
METRICS = [
    ("TTFP p50 (ms)", lambda s: s["ttfp_s"]["p50"], 1000, 0, "lower"),
    ("TTFP p90 (ms)", lambda s: s["ttfp_s"]["p90"], 1000, 0, "lower"),
    ("TTFP p99 (ms)", lambda s: s["ttfp_s"]["p99"], 1000, 0, "lower"),
    ("E2E p50 (s)", lambda s: s["e2e_s"]["p50"], 1, 3, "lower"),
    ("E2E p99 (s)", lambda s: s["e2e_s"]["p99"], 1, 3, "lower"),
    ("RTF p50 (lower = faster)", lambda s: s["rtf"]["p50"], 1, 3, "lower"),
    ("audio throughput (audio-s/s)", lambda s: s["audio_throughput"], 1, 2, "higher"),
    ("request throughput (req/s)", lambda s: s["request_throughput"], 1, 3, "higher"),
    ("inter-chunk gap p99 (ms)", lambda s: s["inter_chunk_gap_s"]["p99"], 1000, 0, "lower"),
    ("no-underrun share", lambda s: (s.get("continuity") or {}).get("no_underrun_rate"), 1, 2, None),
    ("worst underrun (ms)", lambda s: (s.get("continuity") or {}).get("worst_underrun_s"), 1000, 0, None),
    ("mean audio duration (s)", lambda s: s["audio_duration_s"]["mean"], 1, 2, None),
    ("completed / failed", lambda s: f"{s['completed']} / {s['failed']}", None, 0, None),
]


def ratio(ref, val, direction) -> float | None:
    """> 1 = `val` is better than `ref`."""
    if direction is None or not isinstance(ref, (int, float)) or not isinstance(val, (int, float)):
        return None
    if ref <= 0 or val <= 0:
        return None
    return ref / val if direction == "lower" else val / ref


def _name(result: dict, path: str) -> str:
    name = result.get("label") or os.path.splitext(os.path.basename(path))[0]
    return name


def _load(path: str) -> dict:
    """A result file, or a ValueError that names it (among several files a bare "result.schema missing" does not
    say which one is bad)."""
    try:
        return load_result(path)
    except OSError as e:        # (a missing file, not gzip, ...)
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:      # not JSON, or not a bench result
        raise ValueError(f"{path}: {e}") from None


def compare(paths: list[str], align: str = "key") -> str:
    results = [_load(p) for p in paths]
    names = [_name(r, p) for r, p in zip(results, paths)]
    out = ["Runs:"]
    for i, (r, p, n) in enumerate(zip(results, paths, names)):
        t, tool = r["target"], r["tool"]
        tags = ", ".join(f"{k}={v}" for k, v in r.get("tags", {}).items())
        gpus = ", ".join(g["name"] for g in r["hardware"].get("gpus") or []) or "no GPU"
        out.append(f"  [{i}] {n}: {p} — {t['kind']}" + (f" {t.get('base_url')}" if t.get("base_url") else "")
                   + f", model {t.get('model')}, {gpus}, commit {(tool.get('git_commit') or '?')[:10]}"
                   + (f", {tags}" if tags else ""))
    out.append("Ratios: > 1 = better than the reference (latency: ref/this, throughput: this/ref).")
    for key, entries in _pairs(results, align):
        out.append("")
        if entries is None:
            out.append(f"-- {key}")
            continue
        out.append(f"== {key} ==")
        out.extend(_table(entries, names))
    return "\n".join(out) + "\n"


def _pairs(results: list[dict], align: str):
    if align == "index":
        n = min(len(r["levels"]) for r in results)
        for i in range(n):
            lvs = [r["levels"][i] for r in results]
            yield " | ".join(lv["level"]["key"] for lv in lvs), lvs
        return
    keys = []
    for r in results:
        for lv in r["levels"]:
            if lv["level"]["key"] not in keys:
                keys.append(lv["level"]["key"])
    for key in keys:
        lvs = [next((lv for lv in r["levels"] if lv["level"]["key"] == key), None) for r in results]
        if sum(lv is not None for lv in lvs) >= 2:
            yield key, lvs
        else:
            only = next(i for i, lv in enumerate(lvs) if lv is not None)
            yield f"{key}: only in [{only}] (compare other shapes with --align index)", None


def _fmt(v, scale, nd):
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v * scale:.{nd}f}"


def _table(levels: list, names: list[str]) -> list[str]:
    n = len(levels)
    head = ["metric"] + [f"[{i}] {names[i]}" for i in range(n)]
    head += [f"[{i}] vs [0]" for i in range(1, n)]
    if n > 2:
        head += [f"[{i}] vs [{i - 1}]" for i in range(2, n)]
    rows = [head]
    for label, get, scale, nd, direction in METRICS:
        vals = [_get(get, lv) for lv in levels]
        row = [label] + [_fmt(v, scale or 1, nd) for v in vals]
        row += [_ratio_str(vals[0], vals[i], direction) for i in range(1, n)]
        if n > 2:
            row += [_ratio_str(vals[i - 1], vals[i], direction) for i in range(2, n)]
        rows.append(row)
    widths = [max(len(r[j]) for r in rows) for j in range(len(head))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    durs = [_get(lambda s: s["audio_duration_s"]["mean"], lv) for lv in levels]
    durs = [d for d in durs if d]
    if len(durs) > 1 and max(durs) > 1.1 * min(durs):
        lines.append("warning: mean audio durations differ by more than 10 % — throughput and RTF are not "
                     "comparable; fix the output length (--max-new-tokens with --ignore-eos)")
    return lines


def _get(get, lv):
    if lv is None:
        return None
    try:
        return get(lv["summary"])
    except (KeyError, TypeError):
        return None


def _ratio_str(ref, val, direction) -> str:
    r = ratio(ref, val, direction)
    return "" if r is None else f"×{r:.2f}"
