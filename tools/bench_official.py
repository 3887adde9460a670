#!/usr/bin/env python3
"""Baseline runner: the OFFICIAL Qwen3-TTS package (`qwen-tts`) on the same prompts as `voxflow bench`, written in
the same JSON schema (voxflow.bench/1), so `voxflow bench compare official.json voxflow.json` states voxflow's
speed as a ratio.

Runs in its own virtual environment (the official package is never imported by voxflow; see
tools/oracle/README.md for one), with this repository on PYTHONPATH for voxflow.bench's prompts and report code:

    HF_HUB_OFFLINE=1 PYTHONPATH=. /work/.venv-oracle/bin/python tools/bench_official.py \
        --model /models/Qwen3-TTS-12Hz-1.7B-CustomVoice --device cuda:0 --dtype bfloat16 \
        --num-prompts 32 --batch-size 8,32 --max-new-tokens 150 --ignore-eos --output official.json

Levels:
- `c=1`: one request at a time (`generate_custom_voice` / `generate_voice_design` / `generate_voice_clone` with
  one text) - the shape the official package serves; key c=1 matches voxflow bench's closed loop at c=1.
- `batch=B` (per `--batch-size`): the package's own batch API, B texts per call; every request of a call gets the
  call's time as its TTFP and E2E (the official code does not stream).
The official code returns whole waveforms, so TTFP = E2E and continuity is not measured. Fixed length
(`--ignore-eos`): the talker's `generate` gets min_new_tokens = max_new_tokens, so EOS cannot end it early (random
weights, comparable audio lengths); max_new_tokens counts as in voxflow (N -> N - 1 frames without EOS).
GPU timings are taken after torch.cuda.synchronize().
"""
from __future__ import annotations

import argparse
import functools
import importlib.metadata
import io
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from voxflow.bench import report  # noqa: E402
from voxflow.bench.metrics import RequestRecord  # noqa: E402
from voxflow.bench.workloads import (RequestSpec, WorkloadError, describe_prompts, load_prompts,  # noqa: E402
                                     ordered, select)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model folder or hub id")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--attn", default=None, help="attn_implementation (eager, sdpa, flash_attention_2)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--num-warmups", type=int, default=2, help="warm-up calls per level (excluded)")
    ap.add_argument("--no-single", action="store_true", help="skip the one-at-a-time level")
    ap.add_argument("--batch-size", default="", help="comma-separated batch sizes for the batch API levels")
    ap.add_argument("--seed", type=int, default=0, help="prompt order (same as voxflow bench --seed)")
    ap.add_argument("--dataset", default="bundled")
    ap.add_argument("--languages")
    ap.add_argument("--lengths")
    ap.add_argument("--voice", help="speaker (CustomVoice; default Vivian)")
    ap.add_argument("--instructions")
    ap.add_argument("--language", help="send this language for every prompt instead of its own")
    ap.add_argument("--ref-audio")
    ap.add_argument("--ref-text")
    ap.add_argument("--x-vector-only", action="store_true")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--sampling-seed", type=int, help="torch.manual_seed before every call")
    ap.add_argument("--output", "-o", default="official-result.json")
    ap.add_argument("--label", default="official qwen-tts")
    ap.add_argument("--tag", action="append", default=[])
    ap.add_argument("--no-plots", action="store_true")
    return ap.parse_args(argv)


def _split(s):
    return [x.strip() for x in (s or "").split(",") if x.strip()]


class Official:
    def __init__(self, args):
        import torch
        from qwen_tts import Qwen3TTSModel
        self.torch, self.args = torch, args
        kw = dict(device_map=args.device, dtype=getattr(torch, args.dtype))
        if args.attn:
            kw["attn_implementation"] = args.attn
        self.tts = Qwen3TTSModel.from_pretrained(args.model, **kw)
        core = self.tts.model
        self.kind = core.tts_model_type                     # custom_voice | voice_design | base
        speakers = self.tts.get_supported_speakers() or []
        self.voice = args.voice or (next((s for s in speakers if s.lower() == "vivian"), None) or
                                    (speakers[0] if speakers else None))
        if args.ignore_eos:                                 # EOS cannot end generation before max_new_tokens
            talker = core.talker
            original = talker.generate

            @functools.wraps(original)
            def generate(*a, **kw):
                if kw.get("max_new_tokens"):
                    kw["min_new_tokens"] = kw["max_new_tokens"]
                return original(*a, **kw)
            talker.generate = generate
        self.gen = {}
        if args.max_new_tokens:
            self.gen["max_new_tokens"] = args.max_new_tokens
        if args.greedy:
            self.gen.update(do_sample=False, subtalker_dosample=False)
        self.spec = RequestSpec(task={"base": "voice_clone"}.get(self.kind, self.kind), ref_audio=args.ref_audio,
                                ref_text=args.ref_text, x_vector_only=args.x_vector_only, language=args.language)

    def info(self) -> dict:
        core = self.tts.model
        return {"name": os.path.basename(os.path.normpath(self.args.model)), "family": "qwen3_tts",
                "task": self.kind, "size": getattr(core, "tts_model_size", None),
                "sample_rate": getattr(core.speech_tokenizer, "get_output_sample_rate", lambda: None)(),
                "voices": self.tts.get_supported_speakers(), "languages": self.tts.get_supported_languages()}

    def _lang(self, p):
        lang = self.spec.language_of(p)
        return "Auto" if not lang or lang == "auto" else lang.capitalize()

    def synthesize(self, prompts):
        """One call of the official API on a list of prompts; returns (seconds, [samples], sample_rate)."""
        import soundfile as sf
        texts = [p.text for p in prompts]
        langs = [self._lang(p) for p in prompts]
        if self.args.sampling_seed is not None:
            self.torch.manual_seed(self.args.sampling_seed)
        self._sync()
        t0 = time.perf_counter()
        if self.kind == "custom_voice":
            wavs, sr = self.tts.generate_custom_voice(text=texts, speaker=[self.voice] * len(texts), language=langs,
                                                      instruct=self.args.instructions, **self.gen)
        elif self.kind == "voice_design":
            wavs, sr = self.tts.generate_voice_design(text=texts, instruct=[self.args.instructions or ""] * len(texts),
                                                      language=langs, **self.gen)
        else:
            refs, ref_texts = [], []
            for p in prompts:
                data, _, text = self.spec.reference_for(p)
                wav, rsr = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
                refs.append((wav if wav.ndim == 1 else wav.mean(axis=1), rsr))
                ref_texts.append(None if self.args.x_vector_only else text)
            wavs, sr = self.tts.generate_voice_clone(text=texts, language=langs, ref_audio=refs, ref_text=ref_texts,
                                                     x_vector_only_mode=self.args.x_vector_only, **self.gen)
        self._sync()
        return time.perf_counter() - t0, wavs, sr

    def _sync(self):
        if self.torch.cuda.is_available() and str(self.args.device).startswith("cuda"):
            self.torch.cuda.synchronize()


def run_level(off: Official, key: str, batch: int, prompts, warmups, progress=None):
    records = []
    for warm, items in ((True, warmups), (False, prompts)):
        origin = time.perf_counter()
        for start in range(0, len(items), batch):
            group = items[start:start + batch]
            t_send = time.perf_counter() - origin
            try:
                seconds, wavs, sr = off.synthesize(group)
                error = detail = None
            except Exception as e:   # a failed call is recorded, not fatal
                seconds, wavs, sr = time.perf_counter() - origin - t_send, [None] * len(group), None
                error, detail = "client_error", f"{type(e).__name__}: {e}"[:300]
            for j, (p, wav) in enumerate(zip(group, wavs)):
                n = 0 if wav is None else len(wav) * 2
                rec = RequestRecord(index=start + j, prompt_id=p.id, warmup=warm, stream=False, start_s=t_send,
                                    error=error, error_detail=detail, sample_rate=sr, sample_rate_source="engine",
                                    first_byte_s=seconds, end_s=seconds, chunk_times_s=[seconds] if n else [],
                                    chunk_bytes=[n] if n else [], audio_bytes=n, text_chars=len(p.text))
                if rec.error is None and n == 0:
                    rec.error = "no_audio"
                records.append(rec)
            if progress is not None:
                progress.update(len(group))
    return records


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        batches = [int(x) for x in _split(args.batch_size)]
        chosen = select(load_prompts(args.dataset), languages=_split(args.languages), lengths=_split(args.lengths))
    except (ValueError, WorkloadError) as e:
        print(f"bench_official: error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    measured = ordered(chosen, args.num_prompts, args.seed)
    off = Official(args)
    shapes = ([] if args.no_single else [("c=1", "closed", 1)]) + [(f"batch={b}", "batch", b) for b in batches]
    levels = []
    for key, mode, b in shapes:
        warm = ordered(chosen, args.num_warmups * b, args.seed + 1000)
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(measured) + len(warm), desc=f"official {key}", unit="req", leave=False)
        except ImportError:
            bar = None
        recs = run_level(off, key, b, measured, warm, bar)
        if bar is not None:
            bar.close()
        desc = {"key": key, "mode": mode, "concurrency": b, "request_rate": None, "max_concurrency": None,
                "num_prompts": len(measured), "num_warmups": len(warm)}
        entry = report.level_entry(desc, recs)
        s = entry["summary"]
        print(f"{key}: {s['completed']} ok, {s['failed']} failed; E2E p50 {s['e2e_s']['p50']} s, RTF p50 "
              f"{s['rtf']['p50']} (lower is faster), {s['audio_throughput']} audio-s/s", file=sys.stderr)
        levels.append(entry)
    import transformers
    versions = {"qwen_tts": importlib.metadata.version("qwen-tts"), "transformers": transformers.__version__}
    target = {"kind": "official", "base_url": None, "model": args.model, "server_info": None,
              "engine": {"package": "qwen-tts", **versions, "device": args.device, "dtype": args.dtype,
                         "attn_implementation": args.attn, "voice": off.voice, "generate_kwargs": off.gen,
                         "ignore_eos": args.ignore_eos}}
    workload = {"dataset": args.dataset, "languages": _split(args.languages) or None,
                "lengths": _split(args.lengths) or None, "seed": args.seed, "selected": describe_prompts(chosen),
                "measured_prompt_ids": [p.id for p in measured],
                "request": {"max_new_tokens": args.max_new_tokens, "ignore_eos": args.ignore_eos,
                            "greedy": args.greedy, "seed": args.sampling_seed, "stream": "off"}}
    tags = dict(t.split("=", 1) for t in args.tag if "=" in t)
    result = report.build_result(target=target, model=off.info(), config=vars(args), workload=workload,
                                 levels=levels, label=args.label, tags=tags, where="engine",
                                 tool_name="tools/bench_official.py")
    report.write_json(result, args.output)
    prefix = report.result_stem(args.output)
    md = report.markdown_table(result)
    with open(prefix + ".md", "w", encoding="utf-8") as f:
        f.write(md)
    if not args.no_plots:
        try:
            from voxflow.bench.plots import write_plots
            write_plots(result, prefix)
        except ImportError as e:
            print(f"bench_official: no plots ({e})", file=sys.stderr)
    print(md)
    return 0 if any(lv["summary"]["completed"] for lv in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
