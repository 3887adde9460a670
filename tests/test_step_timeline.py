"""benchmarks/scripts/step_timeline.py's arithmetic (what the session READMEs quote from it): every microsecond of
the step stream's wall time charged to one kernel or to the gap before it, and the gaps reported with what the
other streams ran meanwhile."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "scripts"))

import step_timeline  # noqa: E402


def test_critical_path_charges_the_wall_time_once():
    # (name, stream, start, end): a overlaps b (PDL), c after a 10 us gap, d inside c.
    rows = [(0, 7, 0.0, 5.0), (1, 7, 3.0, 8.0), (2, 7, 18.0, 20.0), (3, 7, 18.5, 19.0)]
    path = step_timeline.critical_path(rows)
    assert [(r[3], r[4]) for r in path] == [(5.0, 0.0), (3.0, 0.0), (2.0, 10.0), (0.0, 0.0)]
    assert sum(r[3] + r[4] for r in path) == 20.0                       # the stream's span, 0 .. 20


def test_stalls_name_the_other_streams_work_around_a_gap(capsys):
    names = ["copy", "kernel", "codec"]
    main = [(0, 7, 0.0, 2.0), (1, 7, 302.0, 305.0), (1, 7, 306.0, 310.0)]     # a 300 us gap, then a 1 us one
    codec = [(2, 33, 10.0, 150.0), (2, 33, 150.0, 282.0)]                  # ends 20 us before the gap does
    path = step_timeline.critical_path(main)
    step_timeline.stalls(path, {7: main, 33: codec}, 7, names)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2                                                  # the heading and the one long gap
    assert "300.0 us at" in out[1] and "copy -> kernel" in out[1]
    assert "stream 33: 2 kernels, its last ends 20.0 us before the gap does" in out[1]
    step_timeline.stalls(step_timeline.critical_path(main[1:]), {7: main[1:]}, 7, names)
    assert capsys.readouterr().out == ""                                   # no gap that long: nothing printed


def test_beside_splits_each_kernels_charge_by_whether_another_stream_runs(capsys):
    names = ["gemm", "norm", "codec"]
    # gemm: 5 us alone twice, beside the codec 9 us and 9 + the 9 us gap before it (a kernel whose gap meets the
    # codec's span is beside it too); norm: 2 us alone twice, 2 us beside.
    main = [(0, 7, 0.0, 5.0), (1, 7, 5.0, 7.0), (0, 7, 7.0, 12.0), (0, 7, 21.0, 30.0), (1, 7, 30.0, 32.0),
            (0, 7, 32.0, 41.0), (1, 7, 41.0, 43.0)]
    codec = [(2, 33, 15.0, 25.0), (2, 33, 24.0, 40.0)]
    assert step_timeline.busy_spans(codec) == [(15.0, 40.0)]
    assert step_timeline.overlaps([(15.0, 40.0)], 12.0, 16.0) and not step_timeline.overlaps([(15.0, 40.0)], 40.0, 50)
    path = step_timeline.critical_path(main)
    step_timeline.beside(path, {7: main, 33: codec}, 7, names, steps=1)
    out = capsys.readouterr().out
    # the first gemm after 12 us has a 9 us gap (12 -> 21) inside the codec's span: charge 18 beside
    lines = [ln.split() for ln in out.strip().splitlines()[2:]]
    by_name = {ln[-1]: ln for ln in lines}
    assert by_name["gemm"][:3] == ["5.00", "13.50", "2"]          # (18 + 9) / 2 beside against 5 alone
    assert by_name["norm"][:3] == ["2.00", "2.00", "1"]
    assert "3 of 7 step-stream kernels" in out and "5.67 us more each beside (0.017 ms a step)" in out
    step_timeline.beside(path, {7: main}, 7, names, steps=1)
    assert capsys.readouterr().out == ""                          # no other stream: nothing printed
