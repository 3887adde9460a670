"""The `voxflow` command line: synthesize | serve | bench | make-tiny-checkpoint."""
from __future__ import annotations

import argparse
import os
import sys
import time

EXIT_BAD_INPUT = 2
# N sampled codebook-0 tokens give N - 1 frames (the official loop: the last token gets no frame), so a limit of 1
# asks for silence: refused rather than "succeeding" with an empty file.
MAX_NEW_TOKENS_MESSAGE = "max_new_tokens must be >= 2: N tokens give N - 1 frames of 80 ms"
SAVE_CODES_BESIDE = "<beside the audio>"     # --save-codes given without a PATH


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, except where there is nothing to show (None, False, an empty list) or the
    help already explains its default in words (it mentions "default")."""

    def _get_help_string(self, action):
        default = action.default
        if default is None or default is False or default == [] or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def package_version() -> str:
    """The installed distribution's version (what `pip show voxflow` says), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("voxflow")
    except PackageNotFoundError:             # run from a source tree that is not installed
        from . import __version__
        return __version__


def device_problem(device: str) -> str | None:
    """Why torch cannot run on `device`, or None. Checked before any model loads: torch's own errors come late (after
    the weights were read) and as tracebacks, e.g. AssertionError "Torch not compiled with CUDA enabled"."""
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device!r} is not a device torch knows (e.g. cpu, cuda, cuda:1)"
    if dev.type != "cuda":
        return None
    if not torch.backends.cuda.is_built():
        return (f"--device {device}: CUDA is not available in this torch build (torch {torch.__version__}); "
                "install a CUDA build of torch or use --device cpu")
    if not torch.cuda.is_available():
        return f"--device {device}: torch sees no CUDA GPU (check the driver and CUDA_VISIBLE_DEVICES)"
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"--device {device}: torch sees only {torch.cuda.device_count()} CUDA GPU(s)"
    return None


def _check_device(device: str) -> None:
    problem = device_problem(device)
    if problem:
        raise UsageError(problem)


def _check_writable_file(path: str, flag: str) -> None:
    """Fail before synthesizing, not after: a file the run could not write would waste the whole run."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: folder {folder} is not writable")


def _add_synthesize(sub) -> None:
    p = sub.add_parser("synthesize", help="synthesize speech from text with a Qwen3-TTS model",
                       formatter_class=HelpFormatter,
                       description="Synthesize speech and write 24 kHz WAV files: one utterance (--text, with the "
                                   "eager reference loop) to -o, or a batch (--input-file, one utterance per line, "
                                   "through the batched engine) into --output-dir.")
    p.add_argument("model", help="local model folder or Hugging Face hub id")
    p.add_argument("--text", help="text to speak (or --input-file)")
    p.add_argument("--input-file", help="batch mode: a text file, one utterance per line, synthesized concurrently "
                                        "by the batched engine into --output-dir")
    p.add_argument("--output-dir", help="batch mode: folder for NNNN.wav (and NNNN.npy with --save-codes), NNNN "
                                        "being the line number in --input-file (blank lines are skipped: no file)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="batch mode: requests decoded at once")
    p.add_argument("--voice", help="preset speaker of a CustomVoice model (case-insensitive)")
    p.add_argument("--instructions", help="style instruction (CustomVoice 1.7B) or voice description (VoiceDesign)")
    p.add_argument("--language", default="auto", help="language name, e.g. English, or 'auto' (case-insensitive)")
    p.add_argument("--ref-audio", help="Base models: reference audio file for voice cloning")
    p.add_argument("--ref-text", help="Base models: transcript of the reference audio (ICL mode)")
    p.add_argument("--x-vector-only", action="store_true", help="Base models: clone from the speaker embedding only")
    p.add_argument("--non-streaming-mode", choices=["auto", "true", "false"], default="auto",
                   help="prompt layout: all text up front (true) or text fed along with the frames (false); "
                        "auto: the official layout of the task")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (reproducible output)")
    p.add_argument("--greedy", action="store_true",
                   help="no sampling: the official logits processing, then argmax (codebook 0 and code predictor)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the model's "
                                                     "generation_config.json)")
    p.add_argument("--top-k", type=int, help="sample among the k likeliest tokens (default: the model's "
                                             "generation_config.json)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (default: the model's "
                                               "generation_config.json)")
    p.add_argument("--repetition-penalty", type=float, help="penalty on repeated codebook-0 tokens (default: the "
                                                            "model's generation_config.json)")
    p.add_argument("--max-new-tokens", type=int,
                   help="upper bound on sampled tokens, >= 2: N tokens give at most N - 1 frames of 80 ms "
                        "(default: the model's generation_config.json)")
    p.add_argument("--output", "-o", help="single mode: output WAV path (default: out.wav)")
    p.add_argument("--save-codes", nargs="?", const=SAVE_CODES_BESIDE, metavar="PATH",
                   help="also save the generated codes as int64 .npy of shape [frames, 16]: to PATH, or without "
                        "PATH beside the WAV (x.wav -> x.npy); batch mode: give no PATH, they go to --output-dir as "
                        "NNNN.npy")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="model weights and compute precision")
    p.set_defaults(func=cmd_synthesize)


def _add_tiny(sub) -> None:
    from .tools.tiny_checkpoint import VARIANTS
    p = sub.add_parser("make-tiny-checkpoint", formatter_class=HelpFormatter,
                       help="write tiny random Qwen3-TTS checkpoints in the real file layout (for tests and demos)")
    p.add_argument("out", help="output folder; one sub-folder per variant")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="which model kinds to write (default: all)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the random weights (same seed, same files)")
    p.set_defaults(func=cmd_tiny)


def cmd_tiny(args) -> int:
    from .tools.tiny_checkpoint import write_tiny_checkpoint
    for variant in args.variants:
        path = write_tiny_checkpoint(os.path.join(args.out, variant), variant, seed=args.seed)
        print(f"wrote {variant} -> {path}")
    return 0


def _check_max_new_tokens(n: int | None) -> None:
    if n is not None and n < 2:
        raise UsageError(MAX_NEW_TOKENS_MESSAGE)


def cmd_synthesize(args) -> int:
    import numpy as np
    import torch

    from .audio.io import AudioReadError, load_reference_audio, write_wav
    from .models.hub import ModelNotFoundError
    from .models.qwen3_tts.config import ConfigError
    from .models.qwen3_tts.generate import SynthesisRequest, synthesize
    from .models.qwen3_tts.model import Qwen3TTS

    _check_max_new_tokens(args.max_new_tokens)
    if args.input_file:
        return _synthesize_batch(args)
    if args.output_dir:
        raise UsageError("--output-dir is for batch mode (--input-file); give -o for one utterance")
    if args.text is None:
        raise UsageError("give --text (or --input-file for a batch)")
    if not args.text.strip():
        raise UsageError("--text is empty: give some text to speak")
    output = args.output or "out.wav"
    codes_path = args.save_codes
    if codes_path == SAVE_CODES_BESIDE:
        codes_path = os.path.splitext(output)[0] + ".npy"
    _check_writable_file(output, "-o")
    if codes_path:
        _check_writable_file(codes_path, "--save-codes")
    _check_device(args.device)
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
    try:    # the folders were checked above; what can still fail here (a full disk, ...) is one line too
        write_wav(output, result.wav, model.sample_rate)
        if codes_path:
            np.save(codes_path, result.codes.cpu().numpy().astype(np.int64))
    except OSError as e:
        raise UsageError(f"cannot write {e.filename or output}: {e.strerror or e}") from None
    seconds = len(result.wav) / model.sample_rate
    print(f"wrote {output}: {seconds:.2f} s of audio at {model.sample_rate} Hz, {result.codes.shape[0]} frames, "
          f"finished by {result.finish_reason}, in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.2f})",
          file=sys.stderr)
    return 0


class _CodesRecorder:
    """Each request's codes, for --save-codes in batch mode: the engine keeps none (they go to the codec on the
    device and only PCM comes out), so they are taken as each step's frames go to the codec
    (EngineCore.add_frame_listener), the very frames its audio is decoded from."""

    def __init__(self, core, request_ids):
        self.rows: dict[str, list] = {rid: [] for rid in request_ids}
        if not hasattr(core, "add_frame_listener"):
            raise UsageError("--save-codes is not available in batch mode with this engine")

        def record(frames, request_ids):
            for i, rid in enumerate(request_ids):
                rows = self.rows.get(rid)
                if rows is not None:
                    rows.append(frames[i])
        core.add_frame_listener(record)

    def take(self, request_id: str):
        import numpy as np
        import torch
        rows = self.rows.pop(request_id, [])
        if not rows:
            return np.zeros((0, 16), dtype=np.int64)
        return torch.stack(rows).cpu().numpy().astype(np.int64)


def _synthesize_batch(args) -> int:
    """Many utterances through the batched engine (in-process), one WAV per line, with a progress bar."""
    import numpy as np
    from tqdm import tqdm

    from .audio.io import AudioReadError, load_reference_audio, write_wav
    from .engine.engine import EngineConfig, EngineCore
    from .engine.offline import run_offline
    from .engine.request import SamplingOptions, SpeechRequest, StreamingOptions
    from .models.hub import ModelNotFoundError
    from .models.qwen3_tts.config import ConfigError

    if args.text:
        raise UsageError("give either --text or --input-file, not both")
    if args.output:
        raise UsageError("-o is for one utterance (--text); with --input-file the files go to --output-dir")
    if args.save_codes not in (None, SAVE_CODES_BESIDE):
        raise UsageError("with --input-file, give --save-codes without a PATH: the codes go to --output-dir as "
                         "NNNN.npy beside NNNN.wav")
    if not args.output_dir:
        raise UsageError("--input-file needs --output-dir")
    try:
        with open(args.input_file, encoding="utf-8") as f:
            # (file line number, text): files and error messages are numbered by the line in the file
            lines = [(n, line.strip()) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise UsageError(f"--input-file: cannot read {args.input_file}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"--input-file {args.input_file} is not UTF-8 text ({e.reason})") from None
    if not lines:
        raise UsageError(f"--input-file {args.input_file} has no non-empty lines")
    width = max(4, len(str(lines[-1][0])))          # names sort in line order past line 9999 too
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output-dir {args.output_dir}: {e.strerror}") from None
    if not os.access(args.output_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--output-dir {args.output_dir} is not writable")
    _check_device(args.device)
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

    def request(text: str, request_id: str) -> SpeechRequest:
        return SpeechRequest(text=text, voice=args.voice, instructions=args.instructions, language=args.language,
                             ref_audio=ref, ref_text=args.ref_text, x_vector_only=args.x_vector_only,
                             non_streaming_mode=nsm, sampling=sampling, streaming=StreamingOptions(stream=False),
                             request_id=request_id)

    # The settings shared by every line (voice, language, reference, sampling) checked once on a stand-in text: a
    # bad one is one error, not the same error for each line. (The reference it encodes is cached for the lines.)
    try:
        core.model.prepare(request("Hello.", "settings-check"))
    except ValueError as e:
        core.shutdown()
        raise UsageError(str(e)) from None
    requests = [request(text, f"{n:0{width}d}") for n, text in lines]
    codes = _CodesRecorder(core, [r.request_id for r in requests]) if args.save_codes else None
    failures = []
    bar = tqdm(total=len(requests), unit="utt", desc="synthesizing")

    def write(res):
        bar.update(1)
        rid = res.request.request_id
        if res.final.reason.value == "error":
            failures.append((int(rid), res.final.error))
            return
        write_wav(os.path.join(args.output_dir, rid + ".wav"), res.audio(), core.sample_rate)
        if codes is not None:
            np.save(os.path.join(args.output_dir, rid + ".npy"), codes.take(rid))

    t0 = time.perf_counter()
    results = run_offline(core, requests, on_finish=write)
    bar.close()
    elapsed = time.perf_counter() - t0
    seconds = sum(r.final.usage.audio_seconds for r in results)
    print(f"wrote {len(results) - len(failures)} files to {args.output_dir}: {seconds:.1f} s of audio in "
          f"{elapsed:.1f} s ({seconds / max(elapsed, 1e-9):.2f} audio-s/s)", file=sys.stderr)
    for n, error in sorted(failures):
        print(f"voxflow synthesize: error: line {n}: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT if failures else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="voxflow", description="voxflow: a serving engine for text-to-speech models")
    ap.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
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
