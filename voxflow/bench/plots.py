"""PNG plots of a result: latency percentiles and throughput against load, and the TTFP CDF (matplotlib, Agg).

Closed-loop levels are plotted against concurrency, open-loop levels against request rate (separate files,
`_open` suffix); levels with one point still get a plot. Returns the paths written.
"""
from __future__ import annotations

import math
import os


def _x(level: dict):
    if level["mode"] == "closed":
        return level["concurrency"]
    r = level["request_rate"]
    return math.inf if r == "inf" else r


def write_plots(result: dict, prefix: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(prefix)) or ".", exist_ok=True)
    title = result.get("label") or result["target"].get("model") or "voxflow bench"
    paths = []
    for mode, suffix, xlabel in (("closed", "", "concurrency (closed loop)"),
                                 ("open", "_open", "request rate, req/s (open loop, Poisson)")):
        levels = [lv for lv in result["levels"] if lv["level"]["mode"] == mode]
        levels = [lv for lv in levels if not math.isinf(_x(lv["level"]))]     # rate=inf has no x position
        if not levels:
            continue
        levels.sort(key=lambda lv: _x(lv["level"]))
        xs = [_x(lv["level"]) for lv in levels]
        log = mode == "closed" and len(xs) > 1 and max(xs) / max(min(xs), 1) >= 8

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, metric, scale, unit in ((axes[0], "ttfp_s", 1000, "TTFP (ms)"), (axes[1], "e2e_s", 1, "E2E latency (s)")):
            for p, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
                ys = [_v(lv["summary"][metric][p], scale) for lv in levels]
                ax.plot(xs, ys, style, label=p)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
            ax.legend()
            _xaxis(ax, xs, log)
        fig.suptitle(f"{title}: latency percentiles")
        fig.tight_layout()
        path = f"{prefix}_latency{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        ax.plot(xs, [_v(lv["summary"]["audio_throughput"]) for lv in levels], "o-", color="C0",
                label="audio-s / wall-s")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("audio throughput (audio-s / s)", color="C0")
        ax.grid(alpha=0.3)
        ax2 = ax.twinx()
        ax2.plot(xs, [_v(lv["summary"]["request_throughput"]) for lv in levels], "s--", color="C1", label="req/s")
        ax2.set_ylabel("request throughput (req/s)", color="C1")
        _xaxis(ax, xs, log)
        fig.suptitle(f"{title}: throughput")
        fig.tight_layout()
        path = f"{prefix}_throughput{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    drawn = 0
    for lv in result["levels"]:
        ttfp = sorted(r["ttfp_s"] * 1000 for r in lv["requests"]
                      if not r["warmup"] and r["error"] is None and r["ttfp_s"] is not None)
        if ttfp:
            n = len(ttfp)
            ax.step(ttfp, [(i + 1) / n for i in range(n)], where="post", label=lv["level"]["key"])
            drawn += 1
    ax.set_xlabel("TTFP (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: TTFP CDF")
    fig.tight_layout()
    path = f"{prefix}_ttfp_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def _xaxis(ax, xs, log: bool) -> None:
    if log:
        ax.set_xscale("log", base=2)
    if len(xs) <= 12:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()


def _v(x, scale=1.0):
    return float("nan") if x is None else x * scale
