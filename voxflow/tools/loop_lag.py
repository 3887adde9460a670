"""The API event loop's lag from a server's /metrics text (voxflow_api_event_loop_lag_seconds, voxflow/api/loop_lag.py):
how many timer wake-ups came how late, since the server started; and the API process's garbage-collector pauses
(voxflow_api_gc_pause_seconds, voxflow/engine/gc_freeze.py), which stall that loop.

    curl -s http://127.0.0.1:8000/metrics > metrics.txt
    python -m voxflow.tools.loop_lag metrics.txt [--since EARLIER_SCRAPE]

--since: only the wake-ups after an earlier scrape of the same server (a benchmark run without the server's startup).

Prints e.g. "event-loop lag: 10412 wake-ups, mean 0.61 ms; late by > 1 ms 12.0%, > 2 ms 6.1%, > 5 ms 1.9%, ..."
and "API GC pauses: generation 0 1520 (total 180.2 ms, > 10 ms 0), generation 1 ..., generation 2 ...".
"""
from __future__ import annotations

import argparse

from prometheus_client.parser import text_string_to_metric_families

NAME = "voxflow_api_event_loop_lag_seconds"
GC_NAME = "voxflow_api_gc_pause_seconds"
SHOWN_MS = (1, 2, 5, 10, 20, 50)


def histograms(text: str, name: str, label: str | None = None) -> dict:
    """{value of `label` (None without one): (observations, total, {bucket upper bound: observations at most that})}
    of the histogram `name` in /metrics text; {} when the server exports none."""
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(name):
                continue
            key = s.labels.get(label) if label is not None else None
            row = out.setdefault(key, [0, 0.0, {}])
            if s.name == name + "_count":
                row[0] = int(s.value)
            elif s.name == name + "_sum":
                row[1] = s.value
            elif s.name == name + "_bucket" and s.labels.get("le") not in (None, "+Inf"):
                row[2][float(s.labels["le"])] = int(s.value)
    return {key: tuple(row) for key, row in out.items()}


def lag_histogram(text: str) -> tuple[int, float, dict[float, int]]:
    """(wake-ups, total lag seconds, {bucket upper bound in seconds: wake-ups at most that late}) from /metrics
    text; (0, 0.0, {}) when the server exports no such histogram (the watcher off, or an older server)."""
    return histograms(text, NAME).get(None, (0, 0.0, {}))


def format_lag(text: str, since: str | None = None) -> str:
    """One line for the histogram in /metrics `text`, less what the earlier scrape `since` held."""
    count, total, buckets = lag_histogram(text)
    if since is not None:
        count0, total0, buckets0 = lag_histogram(since)
        count, total = count - count0, total - total0
        buckets = {le: n - buckets0.get(le, 0) for le, n in buckets.items()}
    if count == 0:
        return "event-loop lag: no observations (the server's watcher is off or it exports none)"
    late = [f"> {ms} ms {100 * (count - buckets[ms / 1e3]) / count:.1f}%" for ms in SHOWN_MS if ms / 1e3 in buckets]
    return f"event-loop lag: {count} wake-ups, mean {total / count * 1e3:.2f} ms; late by " + ", ".join(late)


def gc_pauses(text: str) -> dict[str, tuple[int, float, int]]:
    """{generation: (collections, total seconds, collections over 10 ms)} from /metrics text ({} when none)."""
    return {gen: (n, total, n - buckets.get(0.01, 0))
            for gen, (n, total, buckets) in histograms(text, GC_NAME, "generation").items()}


def format_gc_pauses(text: str, since: str | None = None) -> str:
    """One line for the GC pauses in /metrics `text`, less what the earlier scrape `since` held."""
    now, before = gc_pauses(text), gc_pauses(since) if since is not None else {}
    parts = []
    for gen in sorted(now):
        n, total, slow = (a - b for a, b in zip(now[gen], before.get(gen, (0, 0.0, 0))))
        parts.append(f"generation {gen} {n} (total {total * 1e3:.1f} ms, > 10 ms {slow})")
    return "API GC pauses: " + (", ".join(parts) if parts else "none exported (an older server)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="a /metrics scrape (text)")
    p.add_argument("--since", metavar="SCRAPE", help="an earlier scrape of the same server: count only what came after")
    args = p.parse_args(argv)
    since = None
    if args.since:
        with open(args.since) as f:
            since = f.read()
    with open(args.metrics) as f:
        text = f.read()
    print(format_lag(text, since))
    print(format_gc_pauses(text, since))


if __name__ == "__main__":
    main()
