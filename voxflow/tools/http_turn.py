"""Where a closed-loop HTTP run's turnover goes, hop by hop: from a request's final record leaving the engine to its
replacement's prompt built there, joined from the bench's result (`voxflow bench --base-url ...`: each request's
send on CLOCK_MONOTONIC and its end) and the server's request trace (`voxflow serve --trace-requests PATH`:
request_trace.py), taken on one host.

    python -m voxflow.tools.http_turn RESULT.json[.gz] REQUESTS.jsonl

A closed-loop client's user sends its next request as soon as its last one ends: each request is paired with the
same user's next one (the records' `worker`; without it, with the first send after its end not yet paired, within
`max_gap_s`). Per pair, in ms (they add up to the whole turn):

    relay_final     the engine's final record -> this request's final reached the API process
    api_to_client   -> the client read the response's end (the API's last write, HTTP, the client's loop)
    client          -> the client sent the next request
    client_to_api   -> the API's handler began (HTTP, the API's loop)
    api             -> handed to the engine (the handler: parsing, validation, admission)
    intake          -> the engine began its prompt build (ZeroMQ, the wait behind the engine's step and builds)
    build           -> its prompt built and queued (what the step trace's `turn` ends at)
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics

HOPS = ("relay_final", "api_to_client", "client", "client_to_api", "api", "intake", "build")


def load_result_records(path: str) -> list[dict]:
    """Every request of every level (warm-ups too: they take part in the loop) of a bench result file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        result = json.load(f)
    return [r for level in result["levels"] for r in level["requests"]]


def load_trace(path: str) -> dict[str, dict]:
    with open(path) as f:
        return {rec["id"]: rec for rec in (json.loads(line) for line in f if line.strip())}


def client_times(records: list[dict]) -> list[dict]:
    """{id, sent, ended} on the server's clock for each request the bench sent and that named its server id."""
    out = []
    for r in records:
        if r.get("sent_clock_s") is None or r.get("request_id") is None or r.get("end_s") is None:
            continue
        out.append({"id": r["request_id"], "sent": r["sent_clock_s"], "ended": r["sent_clock_s"] + r["end_s"],
                    "worker": r.get("worker")})
    return out


def pairs(clients: list[dict], max_gap_s: float = 0.05) -> list[tuple[dict, dict]]:
    """(ended, next) in a closed loop: a user's consecutive requests when every record names its user (`worker`);
    else each end, in time order, takes the first send at or after it not yet taken. Either way only a send within
    max_gap_s of the end (a send much later belongs to no end: a level's warm-ups then its measured requests)."""
    if clients and all(c["worker"] is not None for c in clients):
        by_user: dict[int, list[dict]] = {}
        for c in sorted(clients, key=lambda c: c["sent"]):
            by_user.setdefault(c["worker"], []).append(c)
        return [(a, b) for seq in by_user.values() for a, b in zip(seq, seq[1:])
                if 0 <= b["sent"] - a["ended"] <= max_gap_s]
    sends = sorted(clients, key=lambda c: c["sent"])
    taken = [False] * len(sends)
    out, j0 = [], 0
    for c in sorted(clients, key=lambda c: c["ended"]):
        while j0 < len(sends) and sends[j0]["sent"] < c["ended"]:
            j0 += 1
        j = j0
        while j < len(sends) and taken[j]:
            j += 1
        if j < len(sends) and sends[j]["sent"] - c["ended"] <= max_gap_s:
            taken[j] = True
            out.append((c, sends[j]))
    return out


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

    def stat(values: list[float]) -> dict:
        v = sorted(x * 1e3 for x in values)
        return {"mean": statistics.mean(v), "p50": statistics.median(v), "p90": v[int(0.9 * (len(v) - 1))]}
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
