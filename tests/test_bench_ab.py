"""`voxflow bench ab`: repeated runs grouped by configuration, tested against a baseline (voxflow/bench/ab.py)."""
import copy
import json
import math
import types

import pytest
import torch

from test_bench import FakeTTS, bench_main, prompt_file, run
from voxflow.bench import ab, report
from voxflow.bench.ab import ABError, ab_table, permutation_p


@pytest.fixture(scope="module")
def fake():
    """A stand-in speech server (test_bench.FakeTTS): the runs whose results are relabelled here."""
    with FakeTTS() as srv:
        yield srv


def test_the_exact_test_counts_every_relabelling_and_ties_count_as_extreme():
    # 3 + 3 runs: 20 relabellings; only the observed one puts all three high values in the configuration
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], higher_is_better=True) == pytest.approx(1 / 20)
    # the same runs when lower is better: every relabelling is at least as good for the configuration
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], higher_is_better=False) == 1.0
    assert permutation_p([3.0, 3.0], [3.0, 3.0], higher_is_better=True) == 1.0
    # 2 + 2: 6 relabellings, and only the observed one puts both high values in the configuration
    assert permutation_p([1.0, 2.0], [3.0, 4.0], higher_is_better=True) == pytest.approx(1 / 6)


def test_the_sampled_test_agrees_with_the_exact_one(monkeypatch):
    base, other = [10.0, 12.0, 11.0, 9.5, 10.5, 11.5], [11.0, 12.5, 11.8, 12.1, 10.9]
    exact = permutation_p(base, other, True)
    assert math.comb(11, 5) <= ab.EXACT_MAX
    monkeypatch.setattr(ab, "EXACT_MAX", 0)
    sampled = permutation_p(base, other, True, shuffles=20_000, seed=1)
    assert 0 < exact < 0.2 and sampled == pytest.approx(exact, abs=0.01)


def _runs(tmp_path, fake, values: dict[str, list[float]], gpu=None) -> list[str]:
    """Result files of one real (fake-server) run, relabelled `{name}_{i}` with these throughputs, created in
    alternating order (e_1, j_1, e_2, j_2, ...)."""
    _, res = run(tmp_path, "--base-url", fake.url, "--dataset", prompt_file(tmp_path, ["steady"]),
                 "--num-prompts", 1, "--num-warmups", 0, "--no-plots", "--label", "x")
    paths, t = [], 0
    for i in range(max(map(len, values.values()))):
        for name, vs in values.items():
            if i >= len(vs):
                continue
            r = copy.deepcopy(res)
            r["label"], r["created_at"] = f"http-{name}_{i + 1}", f"2026-12-08T00:00:{t:02d}+00:00"
            r["levels"][0]["summary"]["audio_throughput"] = vs[i]
            if gpu is not None:
                r["hardware"]["gpus"] = [gpu(name, i)]
            p = tmp_path / f"{name}_{i + 1}.json"
            p.write_text(json.dumps(r))
            paths.append(str(p))
            t += 1
    return paths


def test_runs_are_grouped_by_label_and_tested_against_the_first_files_configuration(tmp_path, fake):
    paths = _runs(tmp_path, fake, {"e": [770.0, 780.0, 775.0], "j": [790.0, 795.0, 800.0]})
    text = ab_table(paths)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| http-")}
    assert rows["http-e (baseline)"][:5] == ["3", "770.0 780.0 775.0", "775.0", "775.0", "5.0"]
    assert rows["http-j"][:5] == ["3", "790.0 795.0 800.0", "795.0", "795.0", "5.0"]
    assert rows["http-j"][5] == "+20.0 (+2.6%)" and rows["http-j"][6] == f"{1 / 20:.3f}"
    assert "one machine" in text and "no GPU" in text
    # another baseline, and the configuration taken from a pattern instead
    flipped = ab_table(paths, baseline="http-j")
    assert "| http-e | 3 |" in flipped and "-20.0 (-2.5%) | 1.000 |" in flipped
    by_pattern = ab_table(paths, group=r"-(\w)_\d+$")
    assert "| e (baseline) | 3 |" in by_pattern and "| j | 3 |" in by_pattern
    with pytest.raises(ABError, match="no results of the baseline 'z'"):
        ab_table(paths, baseline="z")
    with pytest.raises(ABError, match="does not match"):
        ab_table(paths, group=r"nothing(\d)")
    with pytest.raises(ABError, match="has no level 'c=64'"):
        ab_table(paths, level="c=64")
    assert "| http-e (baseline) | 3 |" in ab_table(paths, level="c=1")


def test_runs_of_several_machines_are_refused_unless_asked(tmp_path, fake):
    def gpu(name, i):       # the j runs on another H100 than the e runs
        return {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{'aa' if name == 'e' else 'bb'}"}
    paths = _runs(tmp_path, fake, {"e": [770.0, 780.0], "j": [790.0, 795.0]}, gpu=gpu)
    with pytest.raises(ABError, match="several machines .*GPU-aa.*GPU-bb"):
        ab_table(paths)
    text = ab_table(paths, mixed_machines=True)
    assert "2 machines" in text and "| http-j | 2 |" in text
    same = _runs(tmp_path, fake, {"e": [770.0, 780.0], "j": [790.0, 795.0]},
                 gpu=lambda name, i: {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-cc"})
    text = ab_table(same)
    assert "one machine (NVIDIA H200 GPU-cc)" in text and "cannot be told apart" not in text


def test_the_cli_prints_and_writes_the_table_and_refuses_bad_input(tmp_path, fake, capsys):
    paths = _runs(tmp_path, fake, {"e": [770.0, 780.0], "j": [790.0, 795.0]})
    capsys.readouterr()                                 # (the runs' own reports)
    out = tmp_path / "ab.md"
    assert bench_main(["ab", *paths, "--metric", "audio_throughput", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| http-j | 2 |" in printed and out.read_text() == printed
    assert bench_main(["ab", *paths, "--baseline", "nope"]) == 2
    assert "no results of the baseline 'nope'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert bench_main(["ab", str(tmp_path / "bad.json")]) == 2


def test_a_results_gpus_carry_their_uuid(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2 ** 30, major=9, minor=0,
                                  uuid="4a2c0f1e-0000-1111-2222-333344445555")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    gpus = report.hardware_info("client")["gpus"]
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "memory_gb": 141.0, "capability": "9.0",
                     "uuid": "4a2c0f1e-0000-1111-2222-333344445555"}]
