"""How far a lower-precision codec decoder drifts from fp32: SNR and max abs error of the streamed decode.

    python -m voxflow.tools.codec_snr --model DIR --dtype bfloat16 --device cuda --frames 150

Random codes (seeded) are decoded twice: the reference is ONE pass of the fp32 decoder over all frames; the
candidate is the serving path — the streaming runner (pooled state, padded batches, CUDA graphs on CUDA) fed a
first chunk of 1 frame, then chunks of 25, the last one flagged final — with the decoder in `--dtype`. So the
number covers both the precision and everything streaming changes. Prints one human line, then the same as JSON:

    SNR = 10 * log10(sum(ref^2) / sum((ref - x)^2))  in dB (JSON null when the two are identical)

Only the codec decoder is loaded (DIR/speech_tokenizer), not the talker.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os

import numpy as np
import torch

from voxflow.layers.conv_transpose_gemm import matmul_tf32
from voxflow.models.qwen3_tts.codec_decoder import CodecDecoder
from voxflow.models.qwen3_tts.codec_precision import cast_decoder, snr_db
from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
from voxflow.models.qwen3_tts.config import load_configs
from voxflow.models.qwen3_tts.weights import load_into, read_safetensors, split_prefix


def load_codec_decoder(model_dir: str, device: str = "cpu") -> CodecDecoder:
    """The fp32 codec decoder of a Qwen3-TTS folder (its speech_tokenizer), alone."""
    _, codec_cfg, _ = load_configs(model_dir)
    tensors = read_safetensors(os.path.join(model_dir, "speech_tokenizer", "model.safetensors"), prefix="decoder.")
    with torch.device(device):
        decoder = CodecDecoder(codec_cfg.decoder)
    load_into(decoder, split_prefix(tensors, "decoder."), what=f"{model_dir} codec decoder", prefix="decoder.")
    return decoder.eval().requires_grad_(False)


def random_real_codec_decoder(device: str = "cpu") -> CodecDecoder:
    """An fp32 codec decoder at the real model's shapes with the tiny-checkpoint generator's random weights (no
    checkpoint on disk: the GPU tests and the codec benchmarks)."""
    from voxflow.models.qwen3_tts.config import CodecConfig
    from voxflow.tools.tiny_checkpoint import DEFAULT_SEED, codec_tensors, real_codec_config
    cfg = real_codec_config()
    tensors = {k: torch.from_numpy(v) for k, v in codec_tensors(cfg, DEFAULT_SEED).items() if k.startswith("decoder.")}
    with torch.device(device):
        decoder = CodecDecoder(CodecConfig.from_dict(cfg).decoder)
    load_into(decoder, split_prefix(tensors, "decoder."), what="real-size codec decoder", prefix="decoder.")
    return decoder.eval().requires_grad_(False)


def streamed(runner: Qwen3CodecRunner, codes: torch.Tensor, first: int = 1, chunk: int = 25) -> np.ndarray:
    """codes [T, Q] through the runner: `first` frames, then `chunk` at a time, the last chunk final."""
    state = runner.new_state(None)
    pieces, at, total = [], 0, codes.shape[0]
    while at < total:
        n = min(first if at == 0 else chunk, total - at)
        (pcm,), _ = runner.decode([state], [codes[at: at + n]], final=[at + n == total])
        pieces.append(pcm)
        at += n
    runner.release(state)
    return np.concatenate(pieces)


@contextlib.contextmanager
def _tf32(allowed: bool):
    """cuDNN's TF32 switch as serving leaves it (PyTorch's default: on; all the codec's matmuls follow it,
    CodecDecoder.forward), PyTorch's matmul TF32 switch off as serving leaves it."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        with matmul_tf32(False):
            yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def measure(decoder: CodecDecoder, dtype: torch.dtype, frames: int, *, seed: int = 0, first: int = 1,
            chunk: int = 25, cuda_graphs: bool = True, tf32: bool = False) -> dict:
    """SNR / max abs error of the streamed `dtype` decode against the one-pass fp32 decode of the same codes.
    tf32: the streamed decode's fp32 convolutions and matmuls (all follow cuDNN's switch) use TF32, as
    serving runs them (PyTorch's default); the reference never does."""
    cfg = decoder.config
    codes = torch.randint(0, cfg.codebook_size, (frames, cfg.num_quantizers),
                          generator=torch.Generator().manual_seed(seed))
    device = next(decoder.parameters()).device
    with torch.no_grad(), _tf32(False):
        ref = decoder(codes.T[None].to(device))[0, 0].float().cpu().numpy()
    candidate = decoder if dtype == torch.float32 else cast_decoder(decoder, dtype)
    runner = Qwen3CodecRunner.from_decoder(candidate, max_rows=1, cuda_graphs=cuda_graphs)
    with _tf32(tf32):
        got = streamed(runner, codes, first, chunk)
    snr = snr_db(ref, got)
    return {"dtype": str(dtype).removeprefix("torch."), "tf32": tf32, "device": str(device), "frames": frames,
            "seed": seed, "first_chunk": first, "chunk": chunk, "cuda_graphs": runner.graphs is not None,
            "snr_db": None if math.isinf(snr) else round(snr, 3),
            "max_abs_err": float(np.abs(ref - got).max()),
            "ref_rms": float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voxflow.tools.codec_snr", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Qwen3-TTS folder (its speech_tokenizer is read)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=1, help="frames of the first streamed chunk")
    ap.add_argument("--chunk", type=int, default=25, help="frames of the following chunks")
    ap.add_argument("--no-graphs", action="store_true", help="eager decode steps even on CUDA")
    ap.add_argument("--tf32", action="store_true",
                    help="float32 with TF32 convolutions and matmuls, as served (cuDNN's default), against plain fp32")
    args = ap.parse_args(argv)
    decoder = load_codec_decoder(args.model, args.device)
    result = measure(decoder, getattr(torch, args.dtype), args.frames, seed=args.seed, first=args.first,
                     chunk=args.chunk, cuda_graphs=not args.no_graphs, tf32=args.tf32)
    snr = "identical" if result["snr_db"] is None else f"{result['snr_db']:.2f} dB"
    label = result["dtype"] + (" (TF32)" if args.tf32 else "")
    print(f"{label} streamed vs fp32 one pass, {args.frames} frames on {result['device']}: SNR {snr}, "
          f"max abs error {result['max_abs_err']:.3g}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
