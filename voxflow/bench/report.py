"""The result file (JSON, schema `voxflow.bench/1`), its schema check, and the Markdown summary table.

    {
      "schema": "voxflow.bench/1",
      "tool": {name, version, git_commit, git_dirty},  "created_at": ISO-8601 UTC,
      "command": str, "argv": [...], "label": str|null, "tags": {k: v},
      "target": {kind: http|offline|official, base_url, model, server_info, engine},
      "hardware": {where, platform, python, cpu, cpu_count, memory_gb, torch, cuda_available, gpus: [...]},
      "model": {...}, "config": {...}, "workload": {...}, "notes": {metric: definition},
      "levels": [{"level": {key, mode, concurrency, request_rate, max_concurrency, num_prompts, num_warmups},
                  "summary": metrics.summarize(...), "requests": [RequestRecord.to_json(), ...]}]
    }
    With --quality: summary.quality and requests[i].quality (measured requests); see bench/quality.py.

Everything a later reader needs is inside: raw per-request timings (warm-ups included, flagged), the summary,
what was run where and how. Keys are only ever added; `validate_result` checks the required ones.
"""
from __future__ import annotations

import datetime
import gzip
import json
import os
import platform
import subprocess
import sys
from typing import Sequence

from .metrics import NOTES, RequestRecord, summarize

SCHEMA = "voxflow.bench/1"

RESULT_KEYS = {"schema": str, "tool": dict, "created_at": str, "command": str, "argv": list, "label": (str, type(None)),
               "tags": dict, "target": dict, "hardware": dict, "model": dict, "config": dict, "workload": dict,
               "notes": dict, "levels": list}
LEVEL_KEYS = {"level": dict, "summary": dict, "requests": list}
LEVEL_DESC_KEYS = ("key", "mode", "concurrency", "request_rate", "max_concurrency", "num_prompts", "num_warmups")
SUMMARY_KEYS = ("num_requests", "completed", "failed", "failures", "wall_time_s", "request_throughput",
                "audio_throughput", "total_audio_s", "audio_duration_s", "ttfp_s", "e2e_s", "rtf",
                "inter_chunk_gap_s", "max_inter_chunk_gap_s", "chunks_per_request", "first_chunk_audio_s",
                "sample_rates", "continuity")
STATS_KEYS = ("n", "mean", "p50", "p90", "p95", "p99", "min", "max")
RECORD_KEYS = ("index", "prompt_id", "warmup", "stream", "start_s", "scheduled_s", "status", "error",
               "error_detail", "sample_rate", "sample_rate_source", "channels", "first_byte_s", "end_s",
               "chunk_times_s", "chunk_bytes", "audio_bytes", "text_chars", "request_id", "ttfp_s", "audio_s", "rtf")
# Added after the first results were published: written by every run now, not required of older files.
SUMMARY_OPTIONAL_KEYS = ("ttfp_breakdown_ms", "ttfp_server_split_ms", "ttfp_server_split_slowest_ms")
RECORD_OPTIONAL_KEYS = ("ttfp_parts_s", "server_timing_ms", "sent_clock_s", "worker")
CONTINUITY_OPTIONAL_KEYS = ("first_underrun_chunks",)      # (results from before session 54 lack it)
CONTINUITY_KEYS = ("num_streams", "jitter_buffer_s", "no_underrun_rate", "underrun_requests", "worst_underrun_s",
                   "max_underrun_s", "ok_rate", "viable_chunk_share", "all_viable_rate")


# ------------------------------------------------------------------------------------------------ environment
def git_info() -> dict:
    """The tree's commit and whether tracked files differ from it. VOXFLOW_GIT_COMMIT (and VOXFLOW_GIT_DIRTY=1)
    name them where the tree is a copy without its own git metadata: the lent GPU machine gets the working tree,
    and a stale .git there would name an older commit (benchmarks/scripts/stamp_tree.sh writes the stamp the
    device scripts export)."""
    if os.environ.get("VOXFLOW_GIT_COMMIT"):
        return {"git_commit": os.environ["VOXFLOW_GIT_COMMIT"],
                "git_dirty": os.environ.get("VOXFLOW_GIT_DIRTY") == "1", "git_source": "VOXFLOW_GIT_COMMIT"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = {"git_commit": None, "git_dirty": None}
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                           timeout=10).stdout.strip() or None
        if out["git_commit"]:
            st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10).stdout
            out["git_dirty"] = bool(st.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def tool_info(name: str = "voxflow bench") -> dict:
    try:
        from voxflow import __version__
    except ImportError:
        __version__ = None
    return {"name": name, "version": __version__, **git_info(), "switches": env_switches()}


# VOXFLOW_* names never recorded: credentials (VOXFLOW_API_KEY: results are committed and shared) and the git stamp
# (recorded as git_commit already).
_NOT_SWITCHES = ("KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH", "GIT_")


def env_switches() -> dict:
    """The VOXFLOW_* environment variables of this process (the engine's switches: VOXFLOW_KERNELS, VOXFLOW_PDL,
    VOXFLOW_FOLDED_NORMS, ...; never a credential), so that a result says which variant ran. In an offline run
    this process hosts the engine; in an HTTP run they are the client's, not the server's."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("VOXFLOW_") and not any(word in k[len("VOXFLOW_"):] for word in _NOT_SWITCHES)}


def hardware_info(where: str) -> dict:
    """The machine this process runs on (`where`: client for HTTP runs, engine for offline/official runs)."""
    hw = {"where": where, "platform": platform.platform(), "machine": platform.machine(),
          "python": platform.python_version(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
          "memory_gb": _memory_gb(), "torch": None, "cuda_available": False, "cuda_version": None, "gpus": []}
    try:
        import torch
    except ImportError:
        return hw
    hw["torch"] = torch.__version__
    try:
        if torch.cuda.is_available():
            hw["cuda_available"] = True
            hw["cuda_version"] = torch.version.cuda
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                gpu = {"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2 ** 30, 1),
                       "capability": f"{p.major}.{p.minor}"}
                if getattr(p, "uuid", None) is not None:    # tells two machines of one kind apart (bench ab)
                    gpu["uuid"] = str(p.uuid)
                hw["gpus"].append(gpu)
            hw["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    except Exception as e:  # a broken driver must not lose the benchmark
        hw["cuda_error"] = f"{type(e).__name__}: {e}"[:200]
    return hw


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------------ assembly
def level_entry(level_desc: dict, records: Sequence[RequestRecord], jitter_buffer_s: float = 0.0,
                quality: dict | None = None) -> dict:
    """quality: the --quality pass's level summary (bench/quality.py), added as summary.quality."""
    summary = summarize(records, jitter_buffer_s=jitter_buffer_s)
    if quality is not None:
        summary["quality"] = quality
    return {"level": level_desc, "summary": summary, "requests": [r.to_json() for r in records]}


def build_result(*, target: dict, model: dict, config: dict, workload: dict, levels: list[dict],
                 label: str | None = None, tags: dict | None = None, argv: list[str] | None = None,
                 where: str = "client", tool_name: str = "voxflow bench") -> dict:
    argv = list(sys.argv if argv is None else argv)
    return {
        "schema": SCHEMA,
        "tool": tool_info(tool_name),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(_quote(a) for a in argv),
        "argv": argv,
        "label": label,
        "tags": dict(tags or {}),
        "target": target,
        "hardware": hardware_info(where),
        "model": model,
        "config": config,
        "workload": workload,
        "notes": dict(NOTES),
        "levels": levels,
    }


def _quote(a: str) -> str:
    import shlex
    return shlex.quote(str(a))


def validate_result(d: dict) -> None:
    """Raise ValueError naming every missing / mistyped required key of a result."""
    problems = []

    def need(obj, keys, where):
        if not isinstance(obj, dict):
            problems.append(f"{where} is not an object")
            return
        items = keys.items() if isinstance(keys, dict) else ((k, None) for k in keys)
        for k, t in items:
            if k not in obj:
                problems.append(f"{where}.{k} missing")
            elif t is not None and not isinstance(obj[k], t):
                problems.append(f"{where}.{k} has type {type(obj[k]).__name__}")
    need(d, RESULT_KEYS, "result")
    if not isinstance(d, dict):             # (JSON, but a list or a number: nothing below applies)
        raise ValueError("invalid bench result: " + problems[0])
    if not problems and d["schema"] != SCHEMA:
        problems.append(f"schema is {d['schema']!r}, expected {SCHEMA!r}")
    for i, lv in enumerate(d.get("levels") or []):
        where = f"levels[{i}]"
        need(lv, LEVEL_KEYS, where)
        if not isinstance(lv, dict) or problems:
            continue
        need(lv["level"], LEVEL_DESC_KEYS, where + ".level")
        s = lv["summary"]
        need(s, SUMMARY_KEYS, where + ".summary")
        for k in ("audio_duration_s", "ttfp_s", "e2e_s", "rtf", "inter_chunk_gap_s"):
            if k in s:
                need(s[k], STATS_KEYS, f"{where}.summary.{k}")
        if s.get("continuity") is not None:
            need(s["continuity"], CONTINUITY_KEYS, where + ".summary.continuity")
        for j, r in enumerate(lv["requests"]):
            need(r, RECORD_KEYS, f"{where}.requests[{j}]")
    if problems:
        raise ValueError("invalid bench result: " + "; ".join(problems[:20]))


def _open_text(path: str, mode: str, gz: bool):
    """A text file, gzip-compressed when gz (results hold every request's record: ~0.4 MB a c=256 run as JSON,
    ~10x less gzipped, which keeps the committed results small)."""
    return gzip.open(path, mode + "t", encoding="utf-8") if gz else open(path, mode, encoding="utf-8")


def result_stem(path: str) -> str:
    """The result's path without .json / .json.gz: the .md and plots are written beside it under this stem."""
    for suffix in (".json.gz", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return os.path.splitext(path)[0]


def write_json(result: dict, path: str) -> None:
    """The result as JSON at path (gzip-compressed when the path ends in .gz)."""
    validate_result(result)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with _open_text(tmp, "w", path.endswith(".gz")) as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: str):
    """A JSON file as written by write_json (plain or .gz), not validated."""
    with _open_text(path, "r", path.endswith(".gz")) as f:
        return json.load(f)


def load_result(path: str) -> dict:
    d = read_json(path)
    validate_result(d)
    return d


# ------------------------------------------------------------------------------------------------ Markdown
def _ms(x):
    return "–" if x is None else f"{x * 1000:.0f}"


def _f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def _pct(x):
    return "–" if x is None else f"{x * 100:.0f}%"


def _quality_cell(q: dict | None) -> str:
    if not q:
        return " – |"
    return f" {_f(q.get('mean_wer'), 3)} / {_pct(q.get('ok_rate'))} ({q.get('num_scored', 0)}) |"


def _server_engine_breakdown(result: dict) -> dict | None:
    """HTTP runs: the voxflow server's engine TTFP breakdown (mean ms since the engine started, read from /health
    after the run); None for other servers and offline runs."""
    engine = _engine_of(((result.get("target") or {}).get("server_info") or {}).get("health_after"))
    parts = engine.get("ttfp_breakdown_ms")
    return parts if isinstance(parts, dict) and parts else None


def _engine_of(health: dict | None) -> dict:
    body = (health or {}).get("body")
    engine = body.get("engine") if isinstance(body, dict) else None
    return engine if isinstance(engine, dict) else {}


PREFIX_CACHE_WARN = 0.5     # above this share of reused prompt positions the report warns: TTFP is flattered


def run_counters(result: dict, keys: tuple[str, ...]) -> dict[str, int] | None:
    """The engine's counters `keys` over the run, warm-ups included: an HTTP run's difference of the server's
    counters (/health before and after), an offline run's engine totals. None where any is not reported (other
    servers, older servers and results) or went back (a restarted server)."""
    t = result.get("target") or {}
    info = t.get("server_info") or {}
    if info:
        before, after = _engine_of(info.get("health")), _engine_of(info.get("health_after"))
        if not all(isinstance(e.get(k), int) for e in (before, after) for k in keys):
            return None
        diff = {k: after[k] - before[k] for k in keys}
        return diff if all(v >= 0 for v in diff.values()) else None
    stats = (t.get("engine") or {}).get("stats") or {}
    if not all(isinstance(stats.get(k), int) for k in keys):
        return None
    return {k: stats[k] for k in keys}


def prefix_cache_reuse(result: dict) -> tuple[int, int] | None:
    """(prompt positions found in the engine's prefix cache, prompt positions admitted) during the run, warm-ups
    included (`run_counters`). None where the engine does not report them."""
    c = run_counters(result, ("prompt_tokens_cached", "prompt_tokens"))
    if c is None:
        return None
    cached, total = c["prompt_tokens_cached"], c["prompt_tokens"]
    return (cached, total) if cached <= total else None


def _prefix_cache_line(result: dict) -> str | None:
    reuse = prefix_cache_reuse(result)
    if reuse is None or reuse[1] <= 0:
        return None
    cached, total = reuse
    line = (f"- prefix cache during the run (warm-ups included): {cached} of {total} prompt positions reused "
            f"({cached / total:.0%})")
    if cached / total > PREFIX_CACHE_WARN:
        line += (": most prompt positions were cached (prompts repeated within this run or sent to this server "
                 "before), so prefill and TTFP are lower than for new text; see --unique-prompts")
    return line


def preemptions_during(result: dict) -> int | None:
    """Requests the engine preempted during the run, warm-ups included (their KV pages given back when the pool ran
    out, their positions computed again later: a KV pool too small for the load); `run_counters`."""
    c = run_counters(result, ("preemptions",))
    return None if c is None else c["preemptions"]


def markdown_table(result: dict) -> str:
    lines = []
    t = result["target"]
    lines.append(f"### {result.get('label') or t.get('model') or 'voxflow bench'} ({t['kind']}"
                 + (f", {t['base_url']}" if t.get("base_url") else "") + ")")
    lines.append("")
    has_q = any("quality" in lv["summary"] for lv in result["levels"])
    lines.append("| level | ok/fail | TTFP p50 / p90 / p99 (ms) | E2E p50 / p99 (s) | RTF p50 ↓ | audio-s/s | req/s "
                 "| gap p99 (ms) | no underrun | worst underrun (ms) | mean audio (s) |"
                 + (" WER mean / ok (scored) |" if has_q else ""))
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if has_q else ""))
    for lv in result["levels"]:
        s, c = lv["summary"], lv["summary"].get("continuity") or {}
        tt, e2e = s["ttfp_s"], s["e2e_s"]
        fail = f"{s['failed']}" + (" (" + ", ".join(f"{k}×{v}" for k, v in s["failures"].items()) + ")"
                                   if s["failures"] else "")
        lines.append(f"| {lv['level']['key']} | {s['completed']}/{fail} | {_ms(tt['p50'])} / {_ms(tt['p90'])} / "
                     f"{_ms(tt['p99'])} | {_f(e2e['p50'])} / {_f(e2e['p99'])} | {_f(s['rtf']['p50'], 3)} | "
                     f"{_f(s['audio_throughput'])} | {_f(s['request_throughput'])} | "
                     f"{_ms(s['inter_chunk_gap_s']['p99'])} | {_pct(c.get('no_underrun_rate'))} | "
                     f"{_ms(c.get('worst_underrun_s'))} | {_f(s['audio_duration_s']['mean'])} |"
                     + (_quality_cell(s.get("quality")) if has_q else ""))
    for lv in result["levels"]:
        c = lv["summary"].get("continuity") or {}
        if c.get("underrun_requests"):
            first = c.get("first_underrun_chunks") or {}
            lines.append(f"- {lv['level']['key']}: {c['underrun_requests']} of {c['num_streams']} streams ran dry, "
                         "first at chunk " + (", ".join(f"{k} ({v})" for k, v in first.items()) or "?")
                         + " (0 = the first chunk; each stream counted once)")
        parts = lv["summary"].get("ttfp_breakdown_ms")
        if parts:
            lines.append(f"- {lv['level']['key']}: engine TTFP breakdown, mean ms: "
                         + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in parts.items()))
        for key, which in (("ttfp_server_split_ms", "mean ms"),
                           ("ttfp_server_split_slowest_ms", "mean ms of the slowest tenth")):
            split = lv["summary"].get(key)
            if split:
                lines.append(f"- {lv['level']['key']}: where TTFP went (server's Server-Timing), {which}: "
                             + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in split.items()))
    engine = _server_engine_breakdown(result)
    if engine:
        lines.append("- the server's engine, TTFP breakdown since it started (its /health after the run), mean ms: "
                     + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in engine.items()))
    reuse_line = _prefix_cache_line(result)
    if reuse_line:
        lines.append(reuse_line)
    preempted = preemptions_during(result)
    if preempted:
        lines.append(f"- {preempted} preemptions during the run (warm-ups included): the KV pool ran out and those "
                     "requests' positions were computed again")
    w = result.get("workload") or {}
    if isinstance(w.get("distinct_texts"), int) and w["distinct_texts"] < (w.get("requests_sent") or 0):
        lines.append(f"- {w['requests_sent']} requests (warm-ups included) sent {w['distinct_texts']} different texts: "
                     "a server with prefix caching computes a repeated prompt once (see --unique-prompts)")
    lines.append("")
    lines.append("RTF = E2E latency / audio duration: lower is faster, < 1 is faster than real time. "
                 "audio-s/s = audio seconds per wall second. Warm-up requests excluded.")
    if has_q:
        lines.append("WER: Whisper tiny.en transcript vs the prompt text, English prompts only; ok = WER <= "
                     "--quality-max-wer and no_speech_prob < 0.6.")
    return "\n".join(lines) + "\n"
