"""http_turn.py's pairing of a closed loop's requests and its hops, on hand-made times (its join of a real server's
trace and a real bench run: test_bench.py's test_smoke_against_voxflow_app)."""
import json

import pytest

from voxflow.tools import http_turn


def client(rid, sent, ended, worker=None):
    return {"id": rid, "sent": sent, "ended": ended, "worker": worker}


def test_users_consecutive_requests_pair_and_a_late_send_belongs_to_no_end():
    # two users whose ends and sends interleave: user 0 ends at 1.000 and sends at 1.0004, after user 1's end at
    # 1.0001 and its send at 1.0002 (the order that fools an end-to-next-send match)
    c = [client("a0", 0.0, 1.0000, 0), client("b0", 0.0, 1.0001, 1), client("b1", 1.0002, 2.0, 1),
         client("a1", 1.0004, 2.1, 0), client("a2", 2.5, 3.0, 0)]       # a2: 0.4 s after a1's end (a new phase)
    assert sorted((a["id"], b["id"]) for a, b in http_turn.pairs(c)) == [("a0", "a1"), ("b0", "b1")]
    # without users: each end in time order takes the first free send after it
    anon = [dict(x, worker=None) for x in c]
    assert sorted((a["id"], b["id"]) for a, b in http_turn.pairs(anon)) == [("a0", "b1"), ("b0", "a1")]
    assert http_turn.pairs(anon, max_gap_s=0.00015) == [(anon[1], anon[2])]     # a0 -> b1: 0.2 ms, too far


def test_hops_add_up_to_the_turn_and_a_missing_time_drops_the_pair():
    prev = {"engine_finished": 10.000, "api_final_in": 10.002}
    nxt = {"api_arrived": 10.010, "api_submitted": 10.011, "engine_arrived": 10.020, "engine_prepare": 0.003}
    h = http_turn.hops(client("p", 9.0, 10.005), client("n", 10.006, 11.0), prev, nxt)
    want = {"relay_final": 2, "api_to_client": 3, "client": 1, "client_to_api": 4, "api": 1, "intake": 6, "build": 3}
    assert list(h) == list(http_turn.HOPS)
    assert {k: round(v * 1e3, 6) for k, v in h.items()} == want and sum(h.values()) == pytest.approx(0.020)
    assert http_turn.hops(client("p", 9.0, 10.005), client("n", 10.006, 11.0), prev,
                          dict(nxt, engine_prepare=None)) is None


def test_summary_from_files(tmp_path):
    records = [{"request_id": "p", "sent_clock_s": 9.0, "end_s": 1.005, "worker": 3},
               {"request_id": "n", "sent_clock_s": 10.006, "end_s": 1.0, "worker": 3},
               {"request_id": "x", "sent_clock_s": None, "end_s": 1.0}]              # an offline record: skipped
    (tmp_path / "r.json").write_text(json.dumps({"levels": [{"requests": records}]}))
    trace = [{"id": "p", "engine_finished": 10.000, "api_final_in": 10.002},
             {"id": "n", "api_arrived": 10.010, "api_submitted": 10.011, "engine_arrived": 10.020,
              "engine_prepare": 0.003}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trace))
    s = http_turn.turn_summary(http_turn.load_result_records(str(tmp_path / "r.json")),
                               http_turn.load_trace(str(tmp_path / "t.jsonl")))
    assert s["turns"] == 1 and s["total_ms"]["mean"] == pytest.approx(20.0)
    assert s["hops_ms"]["intake"]["p50"] == pytest.approx(6.0)
    assert http_turn.turn_summary([], {})["turns"] == 0
