"""http_turn.py's pairing of a closed loop's requests and its hops, on hand-made times (its join of a real server's
trace and a real bench run: test_bench.py's test_smoke_against_voxflow_app)."""
import gzip
import json

import pytest

from voxflow.tools import http_turn


def record(rid, sent, end_s, worker, warmup=False, level=0, error=None):
    return {"request_id": rid, "sent_clock_s": sent, "end_s": end_s, "worker": worker, "warmup": warmup,
            "level": level, "error": error}


def paired(records, **kw):
    return sorted((a["id"], b["id"]) for a, b in http_turn.pairs(http_turn.client_times(records), **kw))


def test_a_users_consecutive_requests_pair_within_one_level_and_phase():
    # users 0 and 1 whose ends and sends interleave (user 0 ends first but sends after user 1's send): each request
    # pairs with its own user's next one
    rs = [record("a0", 0.0, 1.0000, 0), record("b0", 0.0, 1.0001, 1), record("b1", 1.0002, 0.9998, 1),
          record("a1", 1.0004, 1.0996, 0)]
    assert paired(rs) == [("a0", "a1"), ("b0", "b1")]
    # a warm-up's end and the measured phase's first send, or two levels: other phases, never a turn
    rs2 = [record("w", 0.0, 1.0, 0, warmup=True), record("m", 1.001, 1.0, 0),
           record("l0", 3.0, 1.0, 0, level=1), record("l1", 4.0005, 1.0, 0, level=1)]
    assert paired(rs2) == [("l0", "l1")]
    # a failed request breaks its user's chain (its neighbours are no turn); a send long after the end is none;
    # an open-loop request (no user) pairs with nothing
    rs3 = [record("x0", 0.0, 1.0, 0), record("x1", 1.0001, 0.5, 0, error="read_error"), record("x2", 1.5002, 1.0, 0),
           record("y0", 0.0, 1.0, 1), record("y1", 1.2, 1.0, 1), record("o0", 0.0, 1.0, None),
           record("o1", 1.0001, 1.0, None)]
    assert paired(rs3) == [] and paired(rs3, max_gap_s=0.3) == [("y0", "y1")]


def test_hops_add_up_to_the_turn_and_a_missing_time_drops_the_pair():
    prev = {"engine_finished": 10.000, "api_final_in": 10.002}
    nxt = {"api_arrived": 10.010, "api_submitted": 10.011, "engine_arrived": 10.020, "engine_prepare": 0.003}
    a, b = {"id": "p", "sent": 9.0, "ended": 10.005}, {"id": "n", "sent": 10.006, "ended": 11.0}
    h = http_turn.hops(a, b, prev, nxt)
    want = {"relay_final": 2, "api_to_client": 3, "client": 1, "client_to_api": 4, "api": 1, "intake": 6, "build": 3}
    assert list(h) == list(http_turn.HOPS)
    assert {k: round(v * 1e3, 6) for k, v in h.items()} == want and sum(h.values()) == pytest.approx(0.020)
    assert http_turn.hops(a, b, prev, dict(nxt, engine_prepare=None)) is None


def test_summary_from_files(tmp_path):
    records = [{"request_id": "p", "sent_clock_s": 9.0, "end_s": 1.005, "worker": 3, "warmup": False,
                "error": None},
               {"request_id": "n", "sent_clock_s": 10.006, "end_s": 1.0, "worker": 3, "warmup": False,
                "error": None},
               {"request_id": "x", "end_s": 1.0}]                          # an offline record: no send clock
    with gzip.open(tmp_path / "r.json.gz", "wt") as f:
        json.dump({"levels": [{"requests": records}]}, f)
    trace = [{"id": "p", "engine_finished": 10.000, "api_final_in": 10.002},
             {"id": "n", "api_arrived": 10.010, "api_submitted": 10.011, "engine_arrived": 10.020,
              "engine_prepare": 0.003}]
    with gzip.open(tmp_path / "t.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(t) + "\n" for t in trace))
    s = http_turn.turn_summary(http_turn.load_result_records(str(tmp_path / "r.json.gz")),
                               http_turn.load_trace(str(tmp_path / "t.jsonl.gz")))
    assert s["turns"] == 1 and s["total_ms"]["mean"] == pytest.approx(20.0)
    assert s["hops_ms"]["intake"]["p50"] == pytest.approx(6.0)
    assert http_turn.turn_summary([], {})["turns"] == 0
