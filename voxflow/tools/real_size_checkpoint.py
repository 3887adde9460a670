"""Random-weight Qwen3-TTS checkpoints at the REAL 0.6B / 1.7B shapes, for speed measurements (no real weights
can be downloaded here). Same layout and generator as the tiny checkpoints (`tiny_checkpoint.py`); only the
dimensions are the released ones. The 1.7B model is ~7.7 GB in fp32: write it where there is room (the GPU machine).

    python -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B
"""
from __future__ import annotations

import argparse
import os
import time

from .tiny_checkpoint import (CODEC_PREPROCESSOR_CONFIG, DEFAULT_SEED, GENERATION_CONFIG, PREPROCESSOR_CONFIG,
                              _save_safetensors, _write_json, codec_tensors, model_tensors, real_codec_config,
                              real_config)
from .tiny_tokenizer import write_tokenizer_files


def write_real_size_checkpoint(out_dir: str, variant: str, size: str, *, seed: int = DEFAULT_SEED) -> str:
    cfg = real_config(variant, size)
    codec = real_codec_config()
    st_dir = os.path.join(out_dir, "speech_tokenizer")
    os.makedirs(st_dir, exist_ok=True)
    _write_json(os.path.join(out_dir, "config.json"), cfg)
    _write_json(os.path.join(out_dir, "generation_config.json"), GENERATION_CONFIG, trailing_newline=False)
    _write_json(os.path.join(out_dir, "preprocessor_config.json"), PREPROCESSOR_CONFIG, trailing_newline=False)
    write_tokenizer_files(out_dir)          # the tiny BPE: text content does not matter for speed
    _save_safetensors(os.path.join(out_dir, "model.safetensors"), model_tensors(cfg, seed))
    _write_json(os.path.join(st_dir, "config.json"), codec, sort_keys=True)
    _write_json(os.path.join(st_dir, "preprocessor_config.json"), CODEC_PREPROCESSOR_CONFIG, sort_keys=True)
    _save_safetensors(os.path.join(st_dir, "model.safetensors"), codec_tensors(codec, seed))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voxflow.tools.real_size_checkpoint", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="custom_voice", choices=["custom_voice", "voice_design", "base"])
    ap.add_argument("--size", default="1.7B", help="0.6B or 1.7B")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    write_real_size_checkpoint(args.out, args.variant, args.size, seed=args.seed)
    print(f"wrote {args.variant} {args.size} -> {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
