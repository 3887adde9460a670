"""Where a closed-loop HTTP run's turnover goes, hop by hop: from a request's final record leaving the engine to its
replacement's prompt built there, joined from the bench's result (`voxflow bench --base-url ...`: each request's
send on CLOCK_MONOTONIC, its end, the closed-loop user that sent it) and the server's request trace (`voxflow serve
--trace-requests PATH`: voxflow/api/request_trace.py), taken on one host.

    python -m voxflow.tools.http_turn RESULT.json[.gz] REQUESTS.jsonl[.gz]

A closed-loop user sends its next request as soon as its last one ends: each request is paired with the same user's
next one in the same level and phase (warm-ups and measured requests apart: the measured phase starts once every
warm-up ended), both answered (a failed request breaks its user's chain). Per pair, in ms (they add up to the turn):

    relay_final     the engine's final record -> the API's handler read it (ZeroMQ, the API's loop, the request's
                    earlier chunks still being written)
    api_to_client   -> the client read the response's end (the API's last writes, HTTP, the client's loop; a whole
                    file's encoding too)
    client          -> the client sent the next request
    client_to_api   -> the API's handler began (HTTP, the API's loop, the body's parsing and validation)
    api             -> handed to the engine (the handler: the request's plan, admission)
    intake          -> the engine began its prompt build (ZeroMQ, the wait behind the engine's step and builds)
    build           -> its prompt built and queued (what the step trace's `turn` ends at)
"""
from __future__ import annotations

import argparse
import gzip
import json

import numpy as np

HOPS = ("relay_final", "api_to_client", "client", "client_to_api", "api", "intake", "build")


def _open(path: str):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def load_result_records(path: str) -> list[dict]:
    """Every request of every level of a bench result file (warm-ups too: they take part in the loop), each with its
    `level` (index in the file) added."""
    with _open(path) as f:
        result = json.load(f)
    return [{**r, "level": i} for i, level in enumerate(result["levels"]) for r in level["requests"]]


def load_trace(path: str) -> dict[str, dict]:
    with _open(path) as f:
        return {rec["id"]: rec for rec in (json.loads(line) for line in f if line.strip())}


def client_times(records: list[dict]) -> list[dict]:
    """{id, sent, ended, ok, user} on the server's clock for each request a closed-loop user sent over HTTP (records
    with `sent_clock_s` and `worker`); user = (level, warm-up or not, worker); ok: answered, with its server id."""
    out = []
    for r in records:
        if r.get("sent_clock_s") is None or r.get("worker") is None:
            continue
        ended = r["sent_clock_s"] + r["end_s"] if r.get("end_s") is not None else None
        out.append({"id": r.get("request_id"), "sent": r["sent_clock_s"], "ended": ended,
                    "ok": r.get("error") is None and r.get("request_id") is not None and ended is not None,
                    "user": (r.get("level", 0), bool(r.get("warmup")), r["worker"])})
    return out


def pairs(clients: list[dict], max_gap_s: float = 0.05) -> list[tuple[dict, dict]]:
    """(a request, its user's next one) for each user's consecutive requests, both ok, the next sent within
    max_gap_s of the end (a sanity bound: a closed-loop user sends at once)."""
    by_user: dict[tuple, list[dict]] = {}
    for c in sorted(clients, key=lambda c: c["sent"]):
        by_user.setdefault(c["user"], []).append(c)
    return [(a, b) for seq in by_user.values() for a, b in zip(seq, seq[1:])
            if a["ok"] and b["ok"] and 0 <= b["sent"] - a["ended"] <= max_gap_s]


def hops(prev_client: dict, next_client: dict, prev: dict, nxt: dict) -> dict[str, float] | None:
    """One turn's hops, seconds (None when a time is missing: a failed request, no first chunk)."""
    need = (prev.get("engine_finished"), prev.get("api_final_in"), nxt.get("api_arrived"), nxt.get("api_submitted"),
            nxt.get("engine_arrived"), nxt.get("engine_prepare"))
    if any(t is None for t in need):
        return None
    build_start = nxt["engine_arrived"] - nxt["engine_prepare"]
    return {"relay_final": prev["api_final_in"] - prev["engine_finished"],
            "api_to_client": prev_client["ended"] - prev["api_final_in"],
            "client": next_client["sent"] - prev_client["ended"],
            "client_to_api": nxt["api_arrived"] - next_client["sent"],
            "api": nxt["api_submitted"] - nxt["api_arrived"],
            "intake": build_start - nxt["api_submitted"],
            "build": nxt["engine_prepare"]}


def turn_summary(records: list[dict], trace: dict[str, dict], max_gap_s: float = 0.05) -> dict:
    """{"turns": n, "hops_ms": {hop: {mean, p50, p90}}, "total_ms": {...}} over every pair with all its times."""
    found = []
    for a, b in pairs(client_times(records), max_gap_s):
        h = hops(a, b, trace.get(a["id"], {}), trace.get(b["id"], {}))
        if h is not None:
            found.append(h)

    def stat(values: list[float]) -> dict:           # (percentiles as the bench's: numpy's linear interpolation)
        v = np.asarray(values) * 1e3
        return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90))}
    if not found:
        return {"turns": 0, "hops_ms": {}, "total_ms": None}
    return {"turns": len(found), "hops_ms": {k: stat([h[k] for h in found]) for k in HOPS},
            "total_ms": stat([sum(h.values()) for h in found])}


def format_summary(s: dict) -> str:
    if not s["turns"]:
        return "no turn with every time (run the bench over HTTP against `voxflow serve --trace-requests`)"
    lines = [f"{s['turns']} turns (a request's final record -> its replacement's prompt built), ms:",
             f"  {'hop':14s} {'mean':>8s} {'p50':>8s} {'p90':>8s}"]
    for k, v in [*s["hops_ms"].items(), ("total", s["total_ms"])]:
        lines.append(f"  {k:14s} {v['mean']:8.2f} {v['p50']:8.2f} {v['p90']:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", help="voxflow bench result (.json or .json.gz)")
    p.add_argument("requests", help="voxflow serve --trace-requests file")
    p.add_argument("--max-gap-ms", type=float, default=50.0, help="an end and a send further apart are no pair")
    args = p.parse_args(argv)
    print(format_summary(turn_summary(load_result_records(args.result), load_trace(args.requests),
                                     args.max_gap_ms / 1e3)))


if __name__ == "__main__":
    main()
