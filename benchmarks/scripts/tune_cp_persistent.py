"""Times the code predictor's one-launch layer step (voxflow/kernels/cp_persistent_layer.py) on a GPU at the 1.7B
shapes, bf16, against what runs today (tune_cp_layer.py's timing method: CUDA-graph replays of a frame's 5 layers x
14 single-token steps, cache lengths 1..14, us per layer step):

1. per row count (--rows): the per-layer path (Qwen3DecoderLayer.forward with the kernels on: ~10 launches a layer
   above one row), the four-kernel layer (cp_layer.py, one row only), the persistent layer at its launch_config,
   and a few config variants (grid, warps, tile widths); each variant's frame output checked against the default
   config's (bf16, close) and the default's against the phase-by-phase launches (equal bits expected: same tiles);
2. CodePredictor.predict (one frame: 15 codes, greedy) with CP_PERSISTENT off / on (MIN_ROWS 1), us per frame and
   whether the greedy codes are equal.

    python benchmarks/scripts/tune_cp_persistent.py [--rows 1,8,64] [--skip-variants]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_cp_layer import DEVICE, DTYPE, frame_us, make_layers, per_layer_step, rand  # noqa: E402
from tune_skinny_linear import bench  # noqa: E402

from voxflow.kernels import cp_layer  # noqa: E402
from voxflow.kernels import cp_persistent_layer as pl  # noqa: E402

VARIANTS = [dict(num_stages=3), dict(num_stages=5), dict(BN_QKV=64, BN_GU=64), dict(BN_O=32, BN_DOWN=32),
            dict(BK=64)]


def persistent_step(weights, config=None, phased=False):
    """Layer i of a frame step; layers after the first take the previous one's sums of squares (as the code
    predictor chains them)."""
    return lambda i, x, cos, sin, c: pl.layer_step(x, weights[i], cos, sin, c.k, c.v, c.claim(), config=config,
                                                   phased=phased, ssq_in=x.ssq if i else None)


@torch.no_grad()
def frame_output(layers, m, step):
    """The last layer's rows after a frame (same inputs every call: seeded)."""
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    torch.manual_seed(1)
    cos_all, sin_all = RotaryEmbedding(128, 1e6, 4096).to(DEVICE).prefix(16, torch.device(DEVICE), DTYPE)
    x = rand(m, 1024, scale=4.0)
    cache = StaticKVCache(len(layers), m, 8, 16, 128, DTYPE, torch.device(DEVICE))
    for c in cache.layers:
        c.k.normal_()
        c.v.normal_()
        c.length = 1
    for t in range(1, 15):
        for i, c in enumerate(cache.layers):
            x = step(i, x, cos_all[:, t:t + 1], sin_all[:, t:t + 1], c)
    return x


@torch.no_grad()
def layer_table(m: int, variants: bool) -> None:
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    layers = make_layers()
    weights = [_layer_weights(layer) for layer in layers]
    base = frame_output(layers, m, persistent_step(weights))
    phased = frame_output(layers, m, persistent_step(weights, phased=True))
    print(f"m={m}: one launch == five phase launches: {torch.equal(base, phased)}; launch_config "
          f"{pl.launch_config(weights[0], m, torch.device(DEVICE))}")
    old = frame_us(layers, m, per_layer_step(layers))
    frame_out = frame_output(layers, m, per_layer_step(layers))
    err = (frame_out.float() - base.float()).abs().max().item() / frame_out.float().abs().max().item()
    print(f"  per-layer path {old:8.2f} us a layer step (persistent's frame output differs by {err:.2e} of max)")
    if m <= 8:
        four = frame_us(layers, m, lambda i, x, cos, sin, c: cp_layer.layer_step(x, weights[i], cos, sin, c.k, c.v,
                                                                                 c.claim()))
        print(f"  four kernels   {four:8.2f} us")
    new = frame_us(layers, m, persistent_step(weights))
    print(f"  persistent     {new:8.2f} us  (x{old / new:.2f} vs the per-layer path)")
    if not variants:
        return
    for cfg in VARIANTS:
        try:
            out = frame_output(layers, m, persistent_step(weights, cfg))
            ok = (out.float() - base.float()).abs().max().item() <= 2e-2 * base.float().abs().max().item()
            t = frame_us(layers, m, persistent_step(weights, cfg))
            print(f"  {str(cfg):40s} {t:8.2f} us{'' if ok else '  WRONG RESULT'}")
        except Exception as e:  # noqa: BLE001 - reported per variant
            print(f"  {str(cfg):40s} failed: {type(e).__name__}: {str(e)[:200]}")


@torch.no_grad()
def predict_table(m: int) -> None:
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.models.qwen3_tts.config import CodePredictorConfig
    cfg = CodePredictorConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                              num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                              max_position_embeddings=65536, vocab_size=2048, num_code_groups=16)
    torch.manual_seed(0)
    cp = cp_mod.CodePredictor(cfg, talker_hidden_size=2048)
    for name, p in cp.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
        elif p.dim() == 2:
            p.data.normal_(0, p.shape[1] ** -0.5)
    cp = cp.to(device=DEVICE, dtype=DTYPE).eval()
    h, c0 = rand(m, 2048), rand(m, 2048)
    saved = cp_mod.CP_PERSISTENT, cp_mod.CP_PERSISTENT_MIN_ROWS
    times, codes = [], []
    try:
        for on in (False, True):
            cp_mod.CP_PERSISTENT, cp_mod.CP_PERSISTENT_MIN_ROWS = on, 1
            out = {}

            def frame():
                out["codes"] = cp.predict(h, c0, lambda logits, j: logits.argmax(-1))[0]
            times.append(bench(frame, 1))
            codes.append(out["codes"].clone())
    finally:
        cp_mod.CP_PERSISTENT, cp_mod.CP_PERSISTENT_MIN_ROWS = saved
    print(f"{m:>4} | {times[0]:10.1f} | {times[1]:10.1f} x{times[0] / times[1]:4.2f} | "
          f"{torch.equal(codes[0], codes[1])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--skip-variants", action="store_true")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, us per layer step (5 layers x 14 steps, CUDA-graph replays)")
    for m in rows:
        layer_table(m, not args.skip_variants)
    print(f"\n{'rows':>4} | {'predict off':>10} | {'persistent':>10}       | same greedy codes   (us a frame)")
    for m in rows:
        predict_table(m)


if __name__ == "__main__":
    main()
