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
