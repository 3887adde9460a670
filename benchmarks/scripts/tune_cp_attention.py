"""Times the code predictor's attention core (voxflow/kernels/dense_decode_norm_rope.py: q/k norms, RoPE, the cache
append and attention over at most 16 positions, one program per (row, KV head)) at the served batch sizes on a GPU:
1.7B code-predictor heads (16 q / 8 kv of 128), bf16, cache position 8, for num_warps 1 / 2 / 4 / 8 (NUM_WARPS is
the default). us a call from CUDA-graph replays; each variant's output checked against the default's.
Session 13 saw 8.4 us a layer step at 64 rows and 23.6 at 256 in the served step (2048 programs for ~8 MB).

    python benchmarks/scripts/tune_cp_attention.py [--rows 1,16,64,256] [--length 8]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402

from voxflow.kernels import dense_decode_norm_rope as nra  # noqa: E402

HQ, HKV, D, L = 16, 8, 128, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,256")
    ap.add_argument("--length", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    bf = torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, cache position {args.length}; "
          f"us a call (CUDA-graph replays); default num_warps {nra.NUM_WARPS}")
    warps = (1, 2, 4, 8)
    print(f"{'rows':>4} | " + " | ".join(f"{w} warps" for w in warps))
    for m in (int(r) for r in args.rows.split(",")):
        qkv = torch.randn(m, (HQ + 2 * HKV) * D, device="cuda").to(bf)
        q = qkv[:, :HQ * D].view(m, 1, HQ, D)
        k = qkv[:, HQ * D:(HQ + HKV) * D].view(m, 1, HKV, D)
        v = qkv[:, (HQ + HKV) * D:].view(m, 1, HKV, D)
        qw, kw = (torch.rand(D, device="cuda") + 0.5).to(bf), (torch.rand(D, device="cuda") + 0.5).to(bf)
        cos, sin = torch.rand(1, 1, D, device="cuda").to(bf), torch.rand(1, 1, D, device="cuda").to(bf)
        kc, vc = torch.randn(m, HKV, L, D, device="cuda").to(bf), torch.randn(m, HKV, L, D, device="cuda").to(bf)

        def call(w):
            return nra.norm_rope_attend_append(q, k, v, qw, kw, 1e-6, 1e-6, cos, sin, kc, vc, args.length, D ** -0.5,
                                               num_warps=w)
        ref = call(None).clone()
        row = []
        for w in warps:
            ok = torch.equal(call(w), ref)
            row.append(f"{bench(lambda: call(w), 1):6.2f}{'' if ok else ' (DIFFERS)'}")
        print(f"{m:4d} | " + " | ".join(row))


if __name__ == "__main__":
    main()
