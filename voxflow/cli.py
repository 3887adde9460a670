"""The `voxflow` command line: synthesize | serve | bench | make-tiny-checkpoint."""
from __future__ import annotations

import argparse
import os
import sys
import time

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _add_synthesize(sub) -> None:
    p = sub.add_parser("synthesize", help="synthesize speech from text with a Qwen3-TTS model (eager reference loop)",
                       description="Synthesize one utterance and write a 24 kHz WAV.")
    p.add_argument("model", help="local model folder or Hugging Face hub id")
    p.add_argument("--text", help="text to speak (or --input-file)")
    p.add_argument("--input-file", help="batch mode: a text file, one utterance per line, synthesized concurrently "
                                        "by the batched engine into --output-dir")
    p.add_argument("--output-dir", help="batch mode: folder for 0001.wav, 0002.wav, ... (and codes if asked)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="batch mode: requests decoded at once")
    p.add_argument("--voice", help="preset speaker of a CustomVoice model (case-insensitive)")
    p.add_argument("--instructions", help="style instruction (CustomVoice 1.7B) or voice description (VoiceDesign)")
    p.add_argument("--language", default="auto", help="language name or 'auto' (case-insensitive)")
    p.add_argument("--ref-audio", help="Base models: reference audio file for voice cloning")
    p.add_argument("--ref-text", help="Base models: transcript of the reference audio (ICL mode)")
    p.add_argument("--x-vector-only", action="store_true", help="Base models: clone from the speaker embedding only")
    p.add_argument("--non-streaming-mode", choices=["auto", "true", "false"], default="auto",
                   help="prompt layout: all text up front (true) or text fed along with the frames (false); "
                        "auto = the official default of the task")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (reproducible output)")
    p.add_argument("--greedy", action="store_true",
                   help="no sampling: the official logits processing, then argmax (codebook 0 and code predictor)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--max-new-tokens", type=int, help="upper bound on generated codec frames (+1)")
    p.add_argument("--output", "-o", default="out.wav", help="output WAV path (default out.wav)")
    p.add_argument("--save-codes", help="also save the generated codes as int64 .npy of shape [frames, 16]")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(func=cmd_synthesize)


def _add_tiny(sub) -> None:
    p = sub.add_parser("make-tiny-checkpoint",
                       help="write tiny random Qwen3-TTS checkpoints in the real file layout (for tests and demos)")
    p.add_argument("out", help="output folder; one sub-folder per variant")
    p.add_argument("--variants", nargs="+", default=["custom_voice", "voice_design", "base"],
                   choices=["custom_voice", "voice_design", "base"])
    p.add_argument("--seed", type=int, default=1234)
    p.set_defaults(func=cmd_tiny)


def cmd_tiny(args) -> int:
    from .tools.tiny_checkpoint import write_tiny_checkpoint
    for variant in args.variants:
        path = write_tiny_checkpoint(os.path.join(args.out, variant), variant, seed=args.seed)
        print(f"wrote {variant} -> {path}")
    return 0


def cmd_synthesize(args) -> int:
    import numpy as np
    import torch

    from .audio.io import AudioReadError, load_reference_audio, write_wav
    from .models.hub import ModelNotFoundError
    from .models.qwen3_tts.config import ConfigError
    from .models.qwen3_tts.generate import SynthesisRequest, synthesize
    from .models.qwen3_tts.model import Qwen3TTS

    if args.input_file:
        return _synthesize_batch(args)
    if args.text is None:
        raise UsageError("give --text (or --input-file for a batch)")
    if not args.text.strip():
        raise UsageError("--text is empty: give some text to speak")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be >= 1")
    ref_audio = None
    if args.ref_audio:
        try:
            ref_audio = load_reference_audio(args.ref_audio, target_sr=24000)
        except AudioReadError as e:
            raise UsageError(f"--ref-audio: {e}") from None
    try:
        model = Qwen3TTS.from_pretrained(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    except (ModelNotFoundError, ConfigError) as e:
        raise UsageError(str(e)) from None
    request = SynthesisRequest(
        text=args.text, speaker=args.voice, instruct=args.instructions, language=args.language,
        ref_audio=ref_audio, ref_text=args.ref_text, x_vector_only=args.x_vector_only,
        non_streaming_mode=None if args.non_streaming_mode == "auto" else args.non_streaming_mode == "true",
        seed=args.seed, greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    try:
        result = synthesize(model, request)
    except ValueError as e:   # unknown voice / language, missing ref text, ... (validated before any compute)
        raise UsageError(str(e)) from None
    elapsed = time.perf_counter() - t0
    write_wav(args.output, result.wav, model.sample_rate)
    if args.save_codes:
        np.save(args.save_codes, result.codes.cpu().numpy().astype(np.int64))
    seconds = len(result.wav) / model.sample_rate
    print(f"wrote {args.output}: {seconds:.2f} s of audio at {model.sample_rate} Hz, {result.codes.shape[0]} frames, "
          f"finished by {result.finish_reason}, in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.2f})",
          file=sys.stderr)
    return 0


def _synthesize_batch(args) -> int:
    """Many utterances through the batched engine (in-process), one WAV per line, with a progress bar."""
    from tqdm import tqdm

    from .audio.io import AudioReadError, load_reference_audio, write_wav
    from .engine.engine import EngineConfig, EngineCore
    from .engine.offline import run_offline
    from .engine.request import SamplingOptions, SpeechRequest, StreamingOptions
    from .models.hub import ModelNotFoundError
    from .models.qwen3_tts.config import ConfigError

    if args.text:
        raise UsageError("give either --text or --input-file, not both")
    if not args.output_dir:
        raise UsageError("--input-file needs --output-dir")
    try:
        with open(args.input_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except OSError as e:
        raise UsageError(f"--input-file: cannot read {args.input_file}: {e.strerror}") from None
    lines = [line for line in lines if line]
    if not lines:
        raise UsageError(f"--input-file {args.input_file} has no non-empty lines")
    ref = None
    if args.ref_audio:
        try:
            ref = load_reference_audio(args.ref_audio, target_sr=24000).astype("<f4").tobytes()
        except AudioReadError as e:
            raise UsageError(f"--ref-audio: {e}") from None
    try:
        core = EngineCore.from_config(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                                   max_num_seqs=args.max_num_seqs))
    except (ModelNotFoundError, ConfigError) as e:
        raise UsageError(str(e)) from None
    sampling = SamplingOptions(seed=args.seed, greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                               max_new_tokens=args.max_new_tokens)
    nsm = None if args.non_streaming_mode == "auto" else args.non_streaming_mode == "true"
    requests = [SpeechRequest(text=line, voice=args.voice, instructions=args.instructions, language=args.language,
                              ref_audio=ref, ref_text=args.ref_text, x_vector_only=args.x_vector_only,
                              non_streaming_mode=nsm, sampling=sampling, streaming=StreamingOptions(stream=False),
                              request_id=f"{i + 1:04d}")
                for i, line in enumerate(lines)]
    os.makedirs(args.output_dir, exist_ok=True)
    failures = []
    bar = tqdm(total=len(requests), unit="utt", desc="synthesizing")

    def write(res):
        bar.update(1)
        if res.final.reason.value == "error":
            failures.append(f"line {int(res.request.request_id)}: {res.final.error}")
            return
        write_wav(os.path.join(args.output_dir, res.request.request_id + ".wav"), res.audio(), core.sample_rate)

    t0 = time.perf_counter()
    results = run_offline(core, requests, on_finish=write)
    bar.close()
    elapsed = time.perf_counter() - t0
    seconds = sum(r.final.usage.audio_seconds for r in results)
    print(f"wrote {len(results) - len(failures)} files to {args.output_dir}: {seconds:.1f} s of audio in "
          f"{elapsed:.1f} s ({seconds / max(elapsed, 1e-9):.2f} audio-s/s)", file=sys.stderr)
    for line in failures:
        print(f"voxflow synthesize: error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT if failures else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="voxflow", description="voxflow: a serving engine for text-to-speech models")
    sub = ap.add_subparsers(dest="command", required=True)
    _add_synthesize(sub)
    from .api.serve import add_serve_parser
    from .bench.cli import add_bench_parser
    add_serve_parser(sub)
    add_bench_parser(sub)
    _add_tiny(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"voxflow {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
