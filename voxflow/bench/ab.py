"""`voxflow bench ab RESULT...`: repeated runs of a few configurations side by side, and whether each one's
difference from the baseline is larger than the runs' own spread.

Why: one machine's runs of one tree spread by a few percent (a lent H100 gave the 0.6B c=64 defaults 757.7-786.1
audio-s/s over ten runs, session 63), as much as most changes move it, so one pair of runs decides nothing. The
device scripts alternate configurations on one machine; this groups their result files by configuration and tests
each against the baseline with a one-sided permutation test of the means: the share of all relabellings of the two
groups' runs whose difference is at least the one observed (exact when there are at most EXACT_MAX relabellings,
else from `shuffles` random ones, seeded; the observed labelling counts as one).

Groups: a result's label (`voxflow bench --label`) without a trailing run number (`http-small-e_3` ->
`http-small-e`), or the first capture group of `--group REGEX` searched in the label (the file name where there is
no label). Values: one level's metric per file (`--level KEY`; by default the file's first level).

Machines: the runs must come from one machine. Two machines of one kind differ by more than most changes (~3%
between two H100s, sessions 61 and 63), so a set whose GPUs differ (by UUID where the results recorded one, else by
name) is an error unless `mixed_machines`. Results without a GPU UUID cannot tell two machines of one kind apart:
the report says so.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import statistics

import numpy as np

from .report import load_result

EXACT_MAX = 200_000
SHUFFLES = 200_000
RUN_NUMBER = re.compile(r"_\d+$")

# name: (title, getter of a level's summary, direction)
METRICS = {
    "audio_throughput": ("audio throughput (audio-s/s)", lambda s: s["audio_throughput"], "higher"),
    "ttfp_p50_ms": ("first packet p50 (ms)", lambda s: s["ttfp_s"]["p50"] * 1e3, "lower"),
    "ttfp_p99_ms": ("first packet p99 (ms)", lambda s: s["ttfp_s"]["p99"] * 1e3, "lower"),
    "rtf_mean": ("RTF mean", lambda s: s["rtf"]["mean"], "lower"),
    "e2e_p50_s": ("end-to-end p50 (s)", lambda s: s["e2e_s"]["p50"], "lower"),
}


class ABError(ValueError):
    """Results that cannot be compared as asked (no group, no such level, several machines)."""


def group_of(result: dict, path: str, pattern: str | None = None) -> str:
    """The configuration a result belongs to: its label (else its file name) without a trailing run number, or the
    first group of `pattern` found in it."""
    name = result.get("label") or os.path.basename(path).split(".")[0]
    if pattern is None:
        return RUN_NUMBER.sub("", name)
    m = re.search(pattern, name)
    if m is None:
        raise ABError(f"--group {pattern!r} does not match {name!r} ({path})")
    return m.group(1) if m.groups() else m.group(0)


def machine_of(result: dict) -> tuple[str, bool]:
    """(a name for the machine a result ran on, whether it identifies one machine: a GPU UUID was recorded)."""
    gpus = (result.get("hardware") or {}).get("gpus") or []
    if not gpus:
        return "no GPU", False
    if all(g.get("uuid") for g in gpus):
        return ", ".join(f"{g['name']} {g['uuid']}" for g in gpus), True
    return ", ".join(g["name"] for g in gpus), False


def level_value(result: dict, path: str, metric: str, level: str | None) -> float:
    levels = result.get("levels") or []
    picked = [lv for lv in levels if level is None or lv["level"].get("key") == level]
    if not picked:
        keys = [lv["level"].get("key") for lv in levels]
        raise ABError(f"{path} has no level {level!r} (it has {keys})")
    return float(METRICS[metric][1](picked[0]["summary"]))


def permutation_p(base: list[float], other: list[float], higher_is_better: bool, shuffles: int = SHUFFLES,
                  seed: int = 0) -> float:
    """One-sided p of `other` being better than `base` by its difference of means: the share of the relabellings
    of the pooled runs (the observed one included) whose difference is at least the observed one."""
    sign = 1.0 if higher_is_better else -1.0
    pooled = np.asarray(base + other, dtype=np.float64) * sign
    n, k = len(pooled), len(other)
    total = pooled.sum()

    def diff(other_sum):             # mean(other) - mean(base) for a relabelling whose `other` runs sum to this
        return other_sum / k - (total - other_sum) / (n - k)
    observed = diff(pooled[len(base):].sum()) - 1e-12 * max(1.0, abs(total))     # (ties count as extreme)
    if math.comb(n, k) <= EXACT_MAX:
        sums = np.fromiter((pooled[list(c)].sum() for c in itertools.combinations(range(n), k)), dtype=np.float64)
        return float(np.mean(diff(sums) >= observed))
    rng = np.random.default_rng(seed)
    sums = np.array([pooled[rng.permutation(n)[:k]].sum() for _ in range(shuffles)])
    return float((1 + np.count_nonzero(diff(sums) >= observed)) / (1 + shuffles))


def _num(v: float, like: float | None = None) -> str:
    """A value at the precision that suits the size of `like` (default: its own): audio-s/s 773.4, ms 12.35, RTF
    0.03984; a difference is written as precisely as the values it is between."""
    size = abs(v if like is None else like)
    return f"{v:.1f}" if size >= 100 else f"{v:.2f}" if size >= 1 else f"{v:.4g}"


def ab_table(paths: list[str], metric: str = "audio_throughput", level: str | None = None,
             baseline: str | None = None, group: str | None = None, mixed_machines: bool = False,
             shuffles: int = SHUFFLES, seed: int = 0) -> str:
    if metric not in METRICS:
        raise ABError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    if not paths:
        raise ABError("no result files")
    title, _, direction = METRICS[metric]
    runs = []                                   # (created_at, group, value, machine, identified)
    for p in paths:
        r = load_result(p)
        runs.append((r.get("created_at") or "", group_of(r, p, group), level_value(r, p, metric, level),
                     *machine_of(r)))
    machines = sorted({m for *_, m, _ in runs})
    if len(machines) > 1 and not mixed_machines:
        raise ABError("these results come from several machines (" + "; ".join(machines) + "): compare runs of one "
                      "machine (or pass --mixed-machines)")
    first_group = runs[0][1]                    # the first file's configuration (the default baseline)
    runs.sort(key=lambda r: r[0])               # run order
    groups: dict[str, list[float]] = {}
    for _, g, v, *_ in runs:
        groups.setdefault(g, []).append(v)
    base = baseline if baseline is not None else first_group
    if base not in groups:
        raise ABError(f"no results of the baseline {base!r} (groups: {', '.join(groups)})")
    better = "higher" if direction == "higher" else "lower"
    identified = all(r[4] for r in runs)
    lines = [f"{title}, {better} is better; {len(runs)} results of {level or 'the first level'} from "
             + ("one machine" if len(machines) == 1 else f"{len(machines)} machines") + f" ({'; '.join(machines)})"
             + ("" if identified else " — no GPU UUID recorded: machines of one kind cannot be told apart"),
             "", f"| configuration | runs | values (run order) | mean | median | sd | vs {base} | p (one-sided) |",
             "|---|---|---|---|---|---|---|---|"]
    ref = groups[base]
    for g, values in sorted(groups.items(), key=lambda kv: kv[0] != base):
        mean = statistics.fmean(values)
        sd = _num(statistics.stdev(values), mean) if len(values) > 1 else "—"
        row = (f"| {g}{' (baseline)' if g == base else ''} | {len(values)} | "
               f"{' '.join(map(_num, values))} | {_num(mean)} | {_num(statistics.median(values))} | {sd} |")
        if g == base:
            row += " | |"
        else:
            delta = mean - statistics.fmean(ref)
            pct = f" ({delta / statistics.fmean(ref) * 100:+.1f}%)" if statistics.fmean(ref) else ""
            p = permutation_p(ref, values, direction == "higher", shuffles, seed)
            row += f" {'+' if delta >= 0 else '-'}{_num(abs(delta), mean)}{pct} | {p:.3f} |"
        lines.append(row)
    lines += ["", "p: the share of relabellings of the baseline's and the configuration's runs that favour the "
              "configuration at least as much as the observed split (one-sided permutation test of the means)."]
    return "\n".join(lines) + "\n"
