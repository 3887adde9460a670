"""voxflow.tools.step_trace_summary: a step trace's wall time grouped by kind of step, on a hand-made trace."""
import gzip
import json

import pytest

from voxflow.tools import step_trace_summary as sts

# (t in s, decode rows, codec chunks launched, prefill chunks, host ms by phase)
STEPS = [(0.000, 2, 0, 1, {}),                        # a warm-up step: before the first full one
         (0.010, 4, 0, 0, {"launch_decode": 0.5, "collect_decode": 4.0}),
         (0.015, 4, 3, 0, {"launch_decode": 0.9}),
         (0.025, 3, 0, 1, {}),
         (0.027, 4, 0, 0, {"launch_decode": 0.7, "collect_decode": 6.0}),
         (0.034, 4, 0, 0, {})]                        # the last step: no successor, not counted


def trace():
    return [dict(step=i, t=t, decode=d, codec_launched=c, prefill=p, ms=ms) for i, (t, d, c, p, ms) in enumerate(STEPS)]


def test_groups_the_span_from_the_first_full_step_by_kind():
    s = sts.summarize(trace())
    assert s["full_rows"] == 4 and s["steps"] == 4
    assert s["span_ms"] == pytest.approx(24.0)
    durations = {k: [round(d, 6) for d in g.durations_ms] for k, g in s["groups"].items()}
    assert durations == {"full": [5.0, 7.0], "full + codec": [10.0], "partial + prefill": [2.0]}
    assert s["mean_rows"] == pytest.approx(15 / 4)
    # rows x ms over the span: 4 x 5 + 4 x 10 + 3 x 2 + 4 x 7 = 94 of 4 x 24
    assert s["row_occupancy"] == pytest.approx(94 / 96)
    assert s["prepare_ms"] == 0
    assert s["host_ms"] == {"collect_decode": pytest.approx(5.0), "launch_decode": pytest.approx(0.6)}
    table = sts.render(s)
    assert "| full | 2 | 12.0 | 50.0% | 6.00 | 6.00 |" in table
    assert table.index("| full |") < table.index("| full + codec |") < table.index("| partial + prefill |")


def test_from_start_and_a_given_full_batch():
    s = sts.summarize(trace(), from_start=True)
    assert s["steps"] == 5 and s["span_ms"] == pytest.approx(34.0)
    assert [round(d, 6) for d in s["groups"]["partial + prefill"].durations_ms] == [10.0, 2.0]
    s = sts.summarize(trace(), full_rows=3)
    assert set(s["groups"]) == {"full", "full + codec", "full + prefill"}
    with pytest.raises(ValueError, match="no step decoded 9 rows"):
        sts.summarize(trace(), full_rows=9)
    with pytest.raises(ValueError, match="two steps"):
        sts.summarize(trace()[:1])


def test_reads_gzipped_traces_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "steps.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in trace())
    sts.main([str(path)])
    out = capsys.readouterr().out
    assert out.startswith("span 24 ms, 4 steps from the first full one (4 rows); mean decode rows a step 3.8")
    assert "host ms by phase (median) of the full steps without codec or prefill work: collect_decode 5.00" in out


def test_steps_that_start_while_codec_calls_are_in_flight_are_grouped_apart():
    """codec_in_flight (the engine's trace from session 25 on): a step that starts while the line before left codec
    calls in flight is a "codec running" step (on a GPU the codec's kernels share the SMs), kept out of the plain
    full steps and their host-phase medians; a trace without the field groups as before."""
    lines = [dict(t=0.000, decode=4, codec_launched=2, prefill=0, codec_in_flight=1, ms={"collect_decode": 1.0}),
             dict(t=0.010, decode=4, codec_launched=0, prefill=0, codec_in_flight=0, ms={"collect_decode": 9.0}),
             dict(t=0.016, decode=4, codec_launched=0, prefill=0, codec_in_flight=0, ms={"collect_decode": 5.0}),
             dict(t=0.021, decode=4, codec_launched=0, prefill=0, codec_in_flight=0, ms={})]
    s = sts.summarize(lines)
    durations = {k: [round(d, 6) for d in g.durations_ms] for k, g in s["groups"].items()}
    assert durations == {"full + codec": [10.0], "full + codec running": [6.0], "full": [5.0]}
    assert s["host_ms"] == {"collect_decode": pytest.approx(5.0)}
    assert "| full + codec running | 1 |" in sts.render(s)
    old = [{k: v for k, v in line.items() if k != "codec_in_flight"} for line in lines]
    assert set(sts.summarize(old)["groups"]) == {"full + codec", "full"}


def test_steps_with_nothing_for_the_talker_are_talker_idle():
    """A step with no decode row and no prefill (a wave's end: the codec drains final chunks) is "talker idle",
    apart from partial steps; a prefill-only step stays partial."""
    lines = [dict(t=0.000, decode=4, codec_launched=4, prefill=0, codec_in_flight=1),
             dict(t=0.005, decode=0, codec_launched=0, prefill=0, codec_in_flight=0),
             dict(t=0.050, decode=0, codec_launched=0, prefill=2, codec_in_flight=0),
             dict(t=0.060, decode=4, codec_launched=0, prefill=0, codec_in_flight=0),
             dict(t=0.066, decode=4, codec_launched=0, prefill=0, codec_in_flight=0)]
    s = sts.summarize(lines)
    durations = {k: [round(d, 6) for d in g.durations_ms] for k, g in s["groups"].items()}
    assert durations == {"full + codec": [5.0], "talker idle + codec running": [45.0], "partial + prefill": [10.0],
                         "full": [6.0]}



def test_prefill_steps_are_summed_with_their_wall_time_per_thousand_tokens():
    """The counted steps that prefilled (from the first full one; the last step has no wall time): their share of
    the span, prompt chunks, tokens and host prefill phase, and wall ms per 1,000 tokens over the steps of >= 256
    tokens (a 100-token step's rate would mostly be its decode)."""
    steps = [dict(step=i, t=t, decode=d, prefill=p, prefill_tokens=n, ms={"prefill": h})
             for i, (t, d, p, n, h) in enumerate([(0.000, 4, 0, 0, 0.0), (0.005, 0, 8, 4000, 9.0),
                                                   (0.025, 4, 2, 1000, 3.0), (0.031, 4, 1, 100, 0.5),
                                                   (0.037, 4, 0, 0, 0.0), (0.042, 4, 3, 500, 1.0)])]
    pf = sts.summarize(steps)["prefill"]
    assert (pf["steps"], pf["prompts"], pf["tokens"]) == (3, 11, 5100)       # the last step (no successor) left out
    assert pf["wall_ms"] == pytest.approx(20.0 + 6.0 + 6.0) and pf["host_ms"] == pytest.approx(12.5)
    assert pf["ms_per_1k_tokens"] == pytest.approx([5.0, 5.5, 6.0])          # 20 ms / 4k, 6 ms / 1k; not 6 / 0.1k
    line = sts.render(sts.summarize(steps)).splitlines()[-1]
    assert line.startswith("prefill: 3 steps (76.2% of the span, 32.0 ms") and "5.00 / 5.50 / 6.00" in line
    no_prefill = [dict(s, prefill=0, prefill_tokens=0) for s in steps]
    assert sts.summarize(no_prefill)["prefill"] is None and "prefill:" not in sts.render(sts.summarize(no_prefill))


def test_prompt_builds_are_summed_over_the_counted_steps():
    steps = trace()
    steps[0]["prepare_ms"] = 50.0                   # before the first full step: not counted
    steps[2]["prepare_ms"] = 3.5
    steps[4]["prepare_ms"] = 1.5
    s = sts.summarize(steps)
    assert s["prepare_ms"] == pytest.approx(5.0)
    assert "prompt builds 5.0 ms on the engine thread" in sts.render(s)


def test_builds_in_steps_that_found_the_decode_before_them_done_are_counted_apart():
    """Of the prompt builds, those before a step whose read of the previous decode did not wait (collect_decode <
    0.3 ms: the GPU had run out of talker work while the host built) are summed apart; a step that waited for its
    decode, or one after a step with nothing decoded, does not count."""
    steps = trace()
    steps[1]["prepare_ms"] = 7.0                    # the first counted step; the warm-up step before it decoded
    steps[1]["ms"]["collect_decode"] = 0.05
    steps[2]["prepare_ms"] = 3.5                    # waited 0.2 ms: counted
    steps[2]["ms"]["collect_decode"] = 0.2
    steps[4]["prepare_ms"] = 1.5                    # waited 6 ms for its decode: the GPU was busy
    steps[3]["decode"] = 0                          # (no effect on step 4, which waited anyway)
    s = sts.summarize(steps)
    assert s["prepare_ms"] == pytest.approx(12.0) and s["prepare_idle_ms"] == pytest.approx(10.5)
    assert "(10.5 of them in steps that found the decode before them done" in sts.render(s)
    steps[0]["decode"] = 0                          # nothing was decoding before step 1: its builds are not counted
    assert sts.summarize(steps)["prepare_idle_ms"] == pytest.approx(3.5)
    steps[2]["ms"]["collect_decode"] = 0.31
    s = sts.summarize(steps)
    assert s["prepare_idle_ms"] == 0 and "of them in steps" not in sts.render(s)


def test_pauses_between_runs_are_left_out_of_the_row_occupancy():
    """A server's trace: two runs with a 5 s pause (nothing to decode) between them; the pause does not count."""
    steps = trace()
    last = steps[-1]["t"]
    steps += [dict(step=10, t=last + 0.002, decode=0, prefill=0, codec_launched=0, ms={}),
              dict(step=11, t=last + 5.002, decode=4, prefill=0, codec_launched=0, ms={}),
              dict(step=12, t=last + 5.012, decode=4, prefill=0, codec_launched=0, ms={})]
    s = sts.summarize(steps)
    # the first run's 94 row-ms + 4 x 2 ms (the step before the pause) + 4 x 10, over 4 rows x (24 + 2 + 10) ms
    assert s["pauses"] == 1 and s["row_occupancy"] == pytest.approx((94 + 8 + 40) / (4 * 36))
    assert "1 pauses of > 1 s left out" in sts.render(s)


def test_turnover_splits_a_replaced_rows_time_and_the_runs_loss():
    """A closed loop of two rows: one request's talker ends (step 1), its final record leaves (step 2), its
    replacement is added and prefills in a 20 ms step (3); the last step that added closes the window."""
    rows = [  # t (s), decode, running, added, finished, prefill
        (0.00, 2, 2, 0, 0, 0), (0.01, 2, 1, 0, 0, 0), (0.02, 1, 1, 0, 1, 0), (0.03, 1, 2, 1, 0, 1),
        (0.05, 2, 2, 0, 0, 0), (0.06, 2, 2, 0, 0, 0)]
    steps = [dict(step=i, t=t, decode=d, running=r, added=a, finished=f, prefill=p, ms={})
             for i, (t, d, r, a, f, p) in enumerate(rows)]
    to = sts.turnover_summary(steps, 2)
    assert to["window_ms"] == pytest.approx(50.0) and to["steady_ms"] == pytest.approx(10.0)
    # 6 frames made at 2 a 10 ms step would take 30 ms: 20 lost, 10 of them rows without a decode
    assert to["loss_ms"] == pytest.approx(20.0) and to["idle_rows_ms"] == pytest.approx(10.0)
    assert to["slow_steps_ms"] == pytest.approx(10.0) and to["replaced"] == 1
    # by kind: the 20 ms prefill step's 10 (the step after it is 10, as steady), the partial steps' 0
    assert to["slow_steps_by_kind_ms"] == {"prefill": pytest.approx(10.0), "partial": pytest.approx(0.0),
                                           "full": pytest.approx(0.0)}
    per = to["per_replacement_row_ms"]
    assert per == {"tail": pytest.approx(10.0), "turn": pytest.approx(10.0), "prefill": pytest.approx(20.0)}
    assert "row-ms each: tail 10.0, turn 10.0, prefill 20.0" in sts.render(sts.summarize(steps))
    assert "slower steps 10 (prefill +10, partial +0, full +0)" in sts.render(sts.summarize(steps))
    # a slower partial step (a wave's edge without prefill) lands in "partial"
    slow = [dict(s, t=s["t"] + (0.005 if s["step"] >= 3 else 0.0)) for s in steps]     # step 2 (1 row) 15 ms
    by = sts.turnover_summary(slow, 2)["slow_steps_by_kind_ms"]
    assert by["partial"] == pytest.approx(5.0) and by["prefill"] == pytest.approx(10.0)
    # a trace without the fields (before session 26) or without an add: no turnover
    assert sts.turnover_summary(trace(), 4) is None
    assert sts.turnover_summary([dict(s, added=0) for s in steps], 2) is None


def test_builds_taken_mid_step_are_not_counted_as_builds_before_an_idle_gpu():
    """intake_while_waiting: a step's builds made inside its wait for the decode (`ms.intake`) ran beside the GPU's
    work; only the part of its prepare_ms beyond the intake's time counts as built between steps. The intake's time
    is summed and rendered."""
    steps = trace()
    steps[2]["prepare_ms"] = 3.5
    steps[2]["ms"]["collect_decode"] = 0.05
    steps[2]["ms"]["intake"] = 3.6                  # all of it mid-step
    s = sts.summarize(steps)
    assert s["prepare_idle_ms"] == 0 and s["intake_ms"] == pytest.approx(3.6)
    assert "3.6 ms of intake mid-step" in sts.render(s)
    steps[2]["ms"]["intake"] = 1.0                  # 2.5 ms of it built between steps, before an idle GPU
    assert sts.summarize(steps)["prepare_idle_ms"] == pytest.approx(2.5)


def test_a_step_over_the_stall_threshold_is_listed_with_its_suspects():
    """A served step that took over STALL_MS is listed with its longest host phase and what the trace says of it
    (Triton compiles, eager prefill forwards, captures, the collector, the GPU allocator's retries and mallocs, the
    stack's growth); a field a trace lacks (older than it, or off a GPU) reads
    "?", not 0. Steps under the threshold, and the talker's idle pauses, are not stalls."""
    steps = trace()
    for s in steps[4:]:                             # the step after the stall, and the last one, move 300 ms on
        s["t"] += 0.3
    steps[3].update(ms={"prefill": 301.0, "schedule": 0.4}, prefill_tokens=4090, capture_ms=0.0, compiles=2,
                    compile_ms=288.5, prefill_eager_runs=1, gc_ms=1.5, alloc_retries=1, cuda_mallocs=3)
    s = sts.summarize(steps)
    (stall,) = s["stalls"]
    assert stall["step"] == 3 and stall["wall_ms"] == pytest.approx(302.0)
    assert stall["phase"] == "prefill" and stall["compiles"] == 2 and stall["prefill_eager_runs"] == 1
    text = sts.render(s)
    assert "stall: step 3 took 302.0 ms (prefill 301.0 ms; 1 prefill chunks, 4090 tokens" in text
    assert "Triton compiles 2 (288.5 ms), eager prefill forwards 1, gc 1.5 ms, allocator retries 1, " \
        "cudaMallocs 3, stack grown ? bytes)" in text           # (a CPU engine's trace has no stack field)
    del steps[3]["compiles"], steps[3]["compile_ms"]
    assert "Triton compiles ? (? ms)" in sts.render(sts.summarize(steps))
    assert sts.summarize(trace())["stalls"] == []
