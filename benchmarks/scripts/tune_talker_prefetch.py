"""The talker's one-row layer step with part of gate|up's weights prefetched into L2 during the attention
(qwen3_layer.ONE_ROW_PREFETCH_MB, voxflow/kernels/l2_prefetch.py), on a GPU at the 1.7B talker's widths (hidden
2048, intermediate 6144, 16 q / 8 kv heads of 128), bf16, one row: 8 layers with distinct weights x 14 steps on a
static KV cache (tune_cp_layer.frame_us), us per layer step, for a grid of prefetch sizes and program counts; the
output of every variant against the off run's (prefetches are hints: the same bits).

    python benchmarks/scripts/tune_talker_prefetch.py [--mb 16,24,32,40] [--programs 32,64,132]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same layers, weights and timing)

import voxflow.layers.qwen3_layer as layer_mod  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="16,24,32,40", help="comma-separated prefetch sizes (MiB of gate|up)")
    ap.add_argument("--programs", default="32,64,132", help="comma-separated program counts")
    args = ap.parse_args()
    cp.H, cp.I = 2048, 6144
    torch.manual_seed(0)
    layers = cp.make_layers(8)
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, one row, talker widths, us per layer step "
          f"(8 layers x 14 steps, CUDA-graph replays)")
    step = cp.per_layer_step(layers)
    x = cp.rand(1, cp.H, scale=4.0)
    from voxflow.layers.static_kv_cache import StaticKVCache
    from voxflow.layers.rotary import RotaryEmbedding
    cos, sin = (t[:, 3:4] for t in RotaryEmbedding(cp.D, 1e6, 4096).to("cuda").prefix(16, torch.device("cuda"),
                                                                                       cp.DTYPE))

    def output() -> torch.Tensor:          # one layer pass on a fresh cache: the bits every variant must give
        cache = StaticKVCache(1, 1, cp.HKV, 16, cp.D, cp.DTYPE, torch.device("cuda"))
        with torch.no_grad():
            return step(0, x, cos, sin, cache.layers[0])
    saved = layer_mod.ONE_ROW_PREFETCH_MB, layer_mod.ONE_ROW_PREFETCH_PROGRAMS
    try:
        layer_mod.ONE_ROW_PREFETCH_MB = 0
        want = output()
        print(f"off: {cp.frame_us(layers, 1, step):6.2f} us", flush=True)
        for programs in [int(p) for p in args.programs.split(",")]:
            for mb in [float(m) for m in args.mb.split(",") if float(m) > 0]:
                layer_mod.ONE_ROW_PREFETCH_MB, layer_mod.ONE_ROW_PREFETCH_PROGRAMS = mb, programs
                us = cp.frame_us(layers, 1, step)
                same = torch.equal(output(), want)
                print(f"prefetch {mb:5.1f} MiB, {programs:3d} programs: {us:6.2f} us  same bits: {same}",
                      flush=True)
        layer_mod.ONE_ROW_PREFETCH_MB = 0
        print(f"off again: {cp.frame_us(layers, 1, step):6.2f} us", flush=True)
    finally:
        layer_mod.ONE_ROW_PREFETCH_MB, layer_mod.ONE_ROW_PREFETCH_PROGRAMS = saved


if __name__ == "__main__":
    main()
