"""`voxflow bench` (online against an HTTP server, or offline in-process) and `voxflow bench compare`.

    voxflow bench --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --num-prompts 64 \
        --max-new-tokens 150 --ignore-eos --output result.json
    voxflow bench --model /models/Qwen3-TTS-12Hz-0.6B-CustomVoice --device cuda --dtype bfloat16 \
        --concurrency 1,8 --num-prompts 32 --output offline.json
    voxflow bench compare official.json result.json

Wiring (voxflow/cli.py): `add_bench_parser(sub)`; the parser's `func` is `run_bench`. Also runnable on its
own: `python -m voxflow.bench ...`.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys

from .ab import METRICS as AB_METRICS
from .workloads import (LENGTHS, RequestSpec, WorkloadError, describe_prompts, load_prompts, ordered,
                        parse_extra_body, select, unique, unique_tag)

EXIT_BAD_INPUT = 2


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    from voxflow.cli import HelpFormatter
    p = subparsers.add_parser(
        "bench", help="benchmark a /v1/audio/speech server (or the engine in-process): latency, RTF, throughput",
        description="Benchmark text-to-speech serving: TTFP, E2E latency, RTF (lower is faster), audio and "
                    "request throughput, inter-chunk gaps, streaming continuity, failures. Closed-loop "
                    "concurrency sweeps and/or open-loop Poisson rates; warm-up excluded. "
                    "`voxflow bench compare A.json B.json` puts results side by side; `voxflow bench ab "
                    "RUNS...` groups repeated runs by configuration and tests each against a baseline.",
        formatter_class=HelpFormatter)
    _add_run_args(p)
    sub = p.add_subparsers(dest="bench_command", metavar="{compare,ab}")
    c = sub.add_parser("compare", help="compare result files side by side (ratios against the first)",
                       formatter_class=HelpFormatter)
    c.add_argument("results", nargs="+", help="result JSON files; the first is the reference")
    c.add_argument("--align", choices=["key", "index"], default="key",
                   help="match levels by key (c=4, rate=2, batch=8) or by position")
    c.add_argument("--output", "-o", help="also write the comparison to this file")
    a = sub.add_parser("ab", help="repeated runs of a few configurations: means, spread, and a permutation test "
                                  "of each against a baseline", formatter_class=HelpFormatter)
    a.add_argument("results", nargs="+", help="result JSON files of one machine, several runs a configuration")
    a.add_argument("--baseline", help="the configuration the others are tested against (default: the first file's)")
    a.add_argument("--group", metavar="REGEX", help="the configuration of a result: the first capture group of REGEX "
                                                    "in its label (default: the label without a trailing _N)")
    a.add_argument("--metric", default="audio_throughput", choices=list(AB_METRICS),
                   help="what each run gives (its direction, higher or lower is better, is the metric's own)")
    a.add_argument("--level", help="the level to read (e.g. c=64; default: each file's first)")
    a.add_argument("--mixed-machines", action="store_true",
                   help="compare runs of several machines (their spread then includes the machines')")
    a.add_argument("--output", "-o", help="also write the table to this file")
    p.set_defaults(func=run_bench)
    return p


def _add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target (one of)")
    g.add_argument("--base-url", help="online mode: server base URL, e.g. http://127.0.0.1:8000")
    g.add_argument("--model", help="offline mode: model folder / hub id, driven in-process (no HTTP)")
    g = p.add_argument_group("online mode")
    g.add_argument("--endpoint", default="/v1/audio/speech", help="path of the speech endpoint on --base-url")
    g.add_argument("--served-model", help="`model` field of the requests (default: the first id of /v1/models)")
    g.add_argument("--api-key", help="sent as Authorization: Bearer ...")
    g.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra HTTP header")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds: connect and longest silence per request")
    g.add_argument("--sample-rate", type=int,
                   help="override the audio sample rate (default: WAV header, X-Sample-Rate, /v1/models, 24000)")
    g = p.add_argument_group("offline mode")
    g.add_argument("--device", default="cpu", help="torch device of the engine: cpu, cuda, cuda:1, ...")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="model precision of the engine")
    g.add_argument("--max-num-seqs", type=int, help="engine slots (default: the engine's default)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any EngineConfig field, e.g. chunk_frames=25 (repeatable)")
    g.add_argument("--no-gc-freeze", action="store_true",
                   help="leave the engine's startup objects in the garbage collector's sight (by default they are "
                        "frozen after startup, as the server does)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", help="closed-loop levels, comma-separated, e.g. 1,4,16,64")
    g.add_argument("--request-rate", help="open-loop Poisson rates in req/s, comma-separated (inf = all at once)")
    g.add_argument("--max-concurrency", type=int, help="open loop: most requests in flight")
    g.add_argument("--num-prompts", type=int, default=32, help="measured requests per level (default 32)")
    g.add_argument("--num-warmups", default="auto",
                   help="warm-up requests per level, excluded from statistics (auto: the level's concurrency; "
                        "open loop 4)")
    g.add_argument("--seed", type=int, default=0, help="prompt order and Poisson arrivals")
    g.add_argument("--unique-prompts", action="store_true",
                   help="give every request its own text (a numbered lead-in with a tag new to this run), so the "
                        "server's prefix cache holds nothing from the text on: first-sight latency")
    g = p.add_argument_group("workload")
    g.add_argument("--dataset", default="bundled",
                   help="bundled (default), a .jsonl / .txt prompt file, or a seed-tts-eval meta.lst")
    g.add_argument("--languages", help="comma-separated filter, e.g. english,chinese")
    g.add_argument("--lengths", help=f"comma-separated filter of {', '.join(LENGTHS)}")
    g.add_argument("--task", choices=["custom_voice", "voice_design", "voice_clone"],
                   help="request task, sent as task_type (default: the model's own: offline the model folder's, "
                        "online the one task /v1/models lists (voxflow servers), else none is sent and the server "
                        "picks; a voice_clone task clones --ref-audio)")
    g.add_argument("--voice", help="voice / speaker for every request")
    g.add_argument("--instructions", help="style instruction / voice description for every request (default: a "
                                          "generic voice description when the task is voice_design)")
    g.add_argument("--language", help="send this language for every prompt (e.g. auto) instead of its own")
    g.add_argument("--no-language", action="store_true", help="do not send a language field")
    g.add_argument("--ref-audio", help="voice clone: reference clip (default: a generated 3 s clip)")
    g.add_argument("--ref-text", help="voice clone: transcript of --ref-audio")
    g.add_argument("--x-vector-only", action="store_true", help="voice clone from the speaker embedding only")
    g = p.add_argument_group("request")
    g.add_argument("--stream", choices=["audio", "sse", "off"], default="audio",
                   help="audio: raw chunked bytes (default); sse: server-sent events; off: whole file")
    g.add_argument("--response-format", choices=["pcm", "wav"], default="pcm",
                   help="audio format asked of the server (the benchmark reads s16 samples from either)")
    g.add_argument("--max-new-tokens", type=int,
                   help="sent as max_new_tokens, >= 2: N tokens give at most N - 1 codec frames of 80 ms")
    g.add_argument("--ignore-eos", action="store_true",
                   help="fixed-length output (sent as ignore_eos: true; random weights never stop by themselves)")
    g.add_argument("--sampling-seed", type=int, help="sent as seed with every request")
    g.add_argument("--greedy", action="store_true", help="sent as greedy: true (voxflow)")
    g.add_argument("--extra-body", help="JSON object (or @file) merged into every request body last; "
                                        "null removes a key. Target-specific extras go here")
    g = p.add_argument_group("metrics and output")
    g.add_argument("--jitter-buffer-ms", type=float, default=0.0,
                   help="continuity: player start delay after the first chunk (default 0)")
    g.add_argument("--output", "-o", default="bench-result.json",
                   help="result JSON, gzip-compressed if it ends in .gz (plots and .md beside it)")
    g.add_argument("--label", help="name of this configuration (shown by compare and in plots)")
    g.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                   help="configuration facts recorded with the run, e.g. batching=on cuda_graphs=off")
    g.add_argument("--no-plots", action="store_true", help="write no PNG plots beside the result")
    g.add_argument("--save-audio", metavar="DIR", help="write every response as a WAV for later quality scoring")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--quality", action="store_true",
                   help="after the run, transcribe every successful measured request with Whisper tiny.en and "
                        "record its WER against the prompt text (English prompts only; needs voxflow[asr])")
    g.add_argument("--quality-max-wer", type=float, default=0.1,
                   help="--quality: a request is ok when WER <= this and no_speech_prob < 0.6 (default 0.1)")


# ------------------------------------------------------------------------------------------------ helpers
def _split(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def build_levels(args):
    from .client import Level
    levels = []
    try:
        cs = [int(x) for x in _split(args.concurrency)]
        rates = [math.inf if x.lower() == "inf" else float(x) for x in _split(args.request_rate)]
    except ValueError:
        raise WorkloadError("--concurrency takes integers, --request-rate numbers or inf") from None
    if any(c < 1 for c in cs) or any(r <= 0 for r in rates):
        raise WorkloadError("--concurrency and --request-rate must be positive")
    if not cs and not rates:
        cs = [1]
    if args.num_prompts < 1:
        raise WorkloadError("--num-prompts must be >= 1")
    for c in cs:
        levels.append(Level("closed", args.num_prompts, _warmups(args, c), concurrency=c))
    for r in rates:
        levels.append(Level("open", args.num_prompts, _warmups(args, None), rate=r,
                            max_concurrency=args.max_concurrency))
    return levels


def _warmups(args, concurrency):
    w = str(args.num_warmups).strip().lower()
    if w == "auto":
        return concurrency if concurrency else 4
    try:
        n = int(w)
    except ValueError:
        raise WorkloadError("--num-warmups takes an integer or auto") from None
    if n < 0:
        raise WorkloadError("--num-warmups must be >= 0")
    return n


def _kv(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise WorkloadError(f"{flag} {item!r}: expected KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def _headers(args) -> dict:
    h = {}
    for item in args.header:
        k, sep, v = item.partition(":")
        if not sep:
            raise WorkloadError(f"--header {item!r}: expected 'Name: value'")
        h[k.strip()] = v.strip()
    if args.api_key:
        h["Authorization"] = f"Bearer {args.api_key}"
    return h


def _spec(args) -> RequestSpec:
    return RequestSpec(task=args.task, voice=args.voice, instructions=args.instructions, language=args.language,
                       send_language=not args.no_language, ref_audio=args.ref_audio, ref_text=args.ref_text,
                       x_vector_only=args.x_vector_only, max_new_tokens=args.max_new_tokens,
                       ignore_eos=args.ignore_eos, seed=args.sampling_seed, greedy=args.greedy, stream=args.stream,
                       response_format=args.response_format, served_model=args.served_model,
                       extra_body=parse_extra_body(args.extra_body))


def _progress(args):
    if args.no_progress:
        return None
    from tqdm import tqdm

    def make(level, total):
        return tqdm(total=total, desc=f"bench {level.key}", unit="req", leave=False, disable=None,
                    file=sys.stderr)
    return make


def _print_level(level, records, jitter_buffer_s):
    from .metrics import summarize
    s = summarize(records, jitter_buffer_s=jitter_buffer_s)
    ms = lambda x: "–" if x is None else f"{x * 1000:.0f} ms"  # noqa: E731
    nm = lambda x, nd=2: "–" if x is None else f"{x:.{nd}f}"  # noqa: E731
    fails = (" (" + ", ".join(f"{k}×{v}" for k, v in s["failures"].items()) + ")") if s["failures"] else ""
    print(f"{level.key}: {s['completed']} ok, {s['failed']} failed{fails}; TTFP p50 {ms(s['ttfp_s']['p50'])}, "
          f"E2E p50 {nm(s['e2e_s']['p50'])} s, RTF p50 {nm(s['rtf']['p50'], 3)} (lower is faster), "
          f"{nm(s['audio_throughput'])} audio-s/s, {nm(s['request_throughput'])} req/s", file=sys.stderr)


def _jsonable(v):
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _redacted(config: dict) -> dict:
    """Arguments as recorded: no secrets (the API key, header values)."""
    out = {k: v for k, v in config.items() if k != "func"}
    if out.get("api_key"):
        out["api_key"] = "<redacted>"
    out["header"] = [h.partition(":")[0] + ": <redacted>" for h in out.get("header") or []]
    return out


def _argv() -> list[str]:
    """The command line as typed (python -m voxflow.bench shown as such), secrets redacted."""
    argv = list(sys.argv)
    if not argv:
        return []
    argv[0] = "python -m voxflow.bench" if argv[0].endswith("__main__.py") else os.path.basename(argv[0])
    for i, a in enumerate(argv[:-1]):
        if a == "--api-key":
            argv[i + 1] = "<redacted>"
        elif a == "--header":
            argv[i + 1] = argv[i + 1].partition(":")[0] + ": <redacted>"
    return [a if not a.startswith("--api-key=") else "--api-key=<redacted>" for a in argv]


# ------------------------------------------------------------------------------------------------ entry
def run_bench(args) -> int:
    try:
        if getattr(args, "bench_command", None) == "compare":
            return _run_compare(args)
        if getattr(args, "bench_command", None) == "ab":
            return _run_ab(args)
        return _run(args)
    except WorkloadError as e:
        print(f"voxflow bench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run_compare(args) -> int:
    from .compare import compare
    return _show(lambda: compare(args.results, align=args.align), args.output)


def _run_ab(args) -> int:
    from .ab import ab_table
    return _show(lambda: ab_table(args.results, metric=args.metric, level=args.level, baseline=args.baseline,
                                  group=args.group, mixed_machines=args.mixed_machines), args.output)


def _show(make_text, output: str | None) -> int:
    """A report made from result files, printed (and written to `output`); a file that cannot be read or compared
    is bad input."""
    try:
        text = make_text()
    except (OSError, ValueError, KeyError) as e:
        raise WorkloadError(str(e)) from None
    print(text, end="")
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


def _run(args) -> int:
    from . import report
    if bool(args.base_url) == bool(args.model):
        raise WorkloadError("give exactly one of --base-url (online) or --model (offline)")
    if getattr(args, "quality", False):
        if args.unique_prompts:
            raise WorkloadError("--quality with --unique-prompts: each text's lead-in (\"Take <tag>-<n>.\") would be "
                                "scored as part of the speech; measure quality in a run of its own")
        from .quality import require_asr
        require_asr()
    levels = build_levels(args)
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        from voxflow.cli import MAX_NEW_TOKENS_MESSAGE
        raise WorkloadError(MAX_NEW_TOKENS_MESSAGE)
    if args.model:
        from voxflow.models.registry import is_one_shot
        if not is_one_shot(args.model):           # (Piper runs on onnxruntime: torch's CUDA does not matter)
            from voxflow.cli import device_problem
            problem = device_problem(args.device)
            if problem:
                raise WorkloadError(problem)
    spec = _spec(args)
    tags = _kv(args.tag, "--tag")
    chosen = select(load_prompts(args.dataset), languages=_split(args.languages), lengths=_split(args.lengths))
    # (no --task: the model's own, which may be voice_clone: checked now, not after the engine loaded)
    if spec.task in (None, "voice_clone") and args.ref_audio and not os.path.isfile(args.ref_audio):
        raise WorkloadError(f"--ref-audio {args.ref_audio}: no such file")
    measured = ordered(chosen, args.num_prompts, args.seed)
    plan = [(lv, measured, ordered(chosen, lv.num_warmups, args.seed + 1000)) for lv in levels]
    tag = None
    if args.unique_prompts:
        # Each level's requests (warm-ups too) get texts of their own: levels run one after another on one server.
        tag, n, plan = unique_tag(), 0, list(plan)
        for i, (lv, lv_measured, lv_warmups) in enumerate(plan):
            plan[i] = (lv, unique(lv_measured, tag, n), unique(lv_warmups, tag, n + len(lv_measured)))
            n += len(lv_measured) + len(lv_warmups)
    jb = args.jitter_buffer_ms / 1000.0
    on_level = lambda lv, recs: _print_level(lv, recs, jb)  # noqa: E731

    if args.base_url:
        from .client import HttpOptions, model_card, run_http
        import urllib.parse
        u = urllib.parse.urlsplit(args.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise WorkloadError(f"--base-url must look like http://host:port, got {args.base_url!r}")
        opts = HttpOptions(base_url=args.base_url, endpoint=args.endpoint, headers=_headers(args),
                           timeout_s=args.timeout, sample_rate=args.sample_rate, save_audio_dir=args.save_audio,
                           keep_audio=bool(getattr(args, "quality", False)))
        out = asyncio.run(run_http(opts, spec, plan, args.seed, _progress(args), on_level))
        card = model_card(out["server_info"])
        target = {"kind": "http", "base_url": args.base_url, "endpoint": args.endpoint,
                  "model": spec.served_model or card.get("id"), "server_info": out["server_info"], "engine": None}
        model = card
        ran = out["levels"]
        where = "client"
    else:
        from . import offline
        core = offline.build_engine(args.model, device=args.device, dtype=args.dtype,
                                    max_num_seqs=args.max_num_seqs,
                                    engine_args=offline.parse_engine_args(args.engine_arg),
                                    gc_freeze=not args.no_gc_freeze)
        spec.use_model_task([core.info().get("task")])
        factory = offline.RequestFactory(core, spec)
        make_bar = _progress(args)
        ran = []
        for lv, prompts, warm in plan:
            bar = make_bar(lv, len(prompts) + len(warm)) if make_bar else None
            try:
                recs = offline.run_level(core, factory, lv, prompts, warm, args.seed, bar,
                                         keep_audio=bool(getattr(args, "quality", False)))
            finally:
                if bar is not None:
                    bar.close()
            ran.append((lv, recs))
            on_level(lv, recs)
        import dataclasses
        model = core.info()
        target = {"kind": "offline", "base_url": None, "model": args.model, "server_info": None,
                  "engine": {"config": dataclasses.asdict(core.config), "stats": core.stats(),
                             "voice": factory.voice, "ignored_extra_body": factory.ignored_extras}}
        core.shutdown()
        where = "engine"

    qualities = [None] * len(ran)
    if getattr(args, "quality", False):
        qualities = _score_quality(ran, chosen, args.quality_max_wer)
    example = spec.body(plan[0][1][0])           # the first request as sent
    if isinstance(example.get("ref_audio"), str):
        example["ref_audio"] = example["ref_audio"][:64] + "..."
    workload = {"dataset": args.dataset, "languages": _split(args.languages) or None,
                "lengths": _split(args.lengths) or None, "seed": args.seed, "selected": describe_prompts(chosen),
                # the set's ids; with --unique-prompts each record's prompt_id adds "-u<n>" (its own text)
                "measured_prompt_ids": [p.id for p in measured], "unique_prompts_tag": tag,
                # every level's requests, warm-ups included, and how many different texts they sent
                "requests_sent": sum(len(m) + len(w) for _, m, w in plan),
                "distinct_texts": len({p.text for _, m, w in plan for p in (*m, *w)}),
                "request": _jsonable(spec.describe()),
                "body_example": example}
    config = _jsonable(_redacted(vars(args)))
    result = report.build_result(target=_jsonable(target), model=_jsonable(model), config=config,
                                 workload=workload, label=args.label, tags=tags,
                                 levels=[report.level_entry(lv.describe(), recs, jb, quality=q)
                                         for (lv, recs), q in zip(ran, qualities)],
                                 argv=_argv(),
                                 where=where)
    report.write_json(result, args.output)
    prefix = report.result_stem(args.output)
    md = report.markdown_table(result)
    with open(prefix + ".md", "w", encoding="utf-8") as f:
        f.write(md)
    written = [args.output, prefix + ".md"]
    if not args.no_plots:
        try:
            from .plots import write_plots
            written += write_plots(result, prefix)
        except ImportError as e:
            print(f"voxflow bench: warning: no plots ({e}); pip install matplotlib", file=sys.stderr)
    print(md)
    print("wrote " + ", ".join(written), file=sys.stderr)
    ok = sum(lv["summary"]["completed"] for lv in result["levels"])
    return 0 if ok else 1


def _score_quality(ran, prompts, max_wer: float) -> list[dict]:
    """The --quality pass over every level (after all of them ran: no transcription during timed requests)."""
    from .quality import score_level
    by_id = {p.id: p for p in prompts}
    out = []
    for lv, recs in ran:
        q = score_level(recs, by_id, max_wer)
        wer = "–" if q["mean_wer"] is None else f"{q['mean_wer']:.3f}"
        ok = "–" if q["ok_rate"] is None else f"{q['ok_rate'] * 100:.0f}%"
        print(f"{lv.key}: quality: {q['num_scored']} scored ({q['num_not_scored']} not), mean WER {wer}, "
              f"ok {ok}", file=sys.stderr)
        out.append(q)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="voxflow")
    sub = ap.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    args = ap.parse_args(["bench"] + list(sys.argv[1:] if argv is None else argv))
    return args.func(args)
