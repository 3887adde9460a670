"""splitk_linear (voxflow/kernels/splitk_linear.py) against cuBLAS's in-place addmm, as the folded decode layers run
their o_proj and down_proj (residual + x @ W^T), at 64 rows and the joint first step's 128: the default launch config
and a grid of others, us a call in CUDA graphs of CALLS calls on weights rotated past the L2 (probe_fp8_gemm.graph_us),
and the best config's difference from addmm. Also, without a residual, against cuBLAS's mm (F.linear's GEMM) at the
K = 1024 projections q|k|v and gate|up: whether more programs than cuBLAS's tiles read those weights faster too.

    python benchmarks/scripts/tune_splitk_linear.py [--quick]
"""
from __future__ import annotations

import itertools
import sys

import torch

from probe_fp8_gemm import graph_us
from voxflow.kernels import splitk_linear as sl

# (name, N, K, with a residual)
SHAPES = (("o_proj", 1024, 2048, True), ("down", 1024, 3072, True), ("qkv", 4096, 1024, False),
          ("gate_up", 6144, 1024, False))

# Weight copies rotated through: 24 x 4.2 MB (o_proj) is twice an H100 / H200 L2 (probe_fp8_gemm's 8 would fit).
COPIES = 24


def grid(quick: bool, k: int) -> list[dict]:
    if quick and k <= 1024:     # few K slices of 1024: many N tiles already
        pairs = ((64, 1), (64, 2), (128, 1), (128, 2), (32, 1), (32, 2), (32, 4))
        return [dict(BLOCK_N=bn, SPLIT=sp) for bn, sp in pairs]
    if quick:
        # (narrow tiles and few splits: a smaller final sum for the last program of each tile)
        pairs = ((32, 8), (64, 4), (64, 16), (128, 8), (32, 4), (16, 8), (16, 4))
        return [dict(BLOCK_N=bn, SPLIT=sp) for bn, sp in pairs]
    return [dict(BLOCK_N=bn, SPLIT=sp, BLOCK_K=bk, num_warps=nw, num_stages=st)
            for bn, sp, bk, nw, st in itertools.product((32, 64, 128), (4, 8, 16), (64, 128), (4, 8), (2, 3, 4))
            if not (bn == 128 and nw == 4 and bk == 128)]


def main() -> None:
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, us a call")
    for rows in (64, 128):
        for name, n, k, with_residual in SHAPES:
            x = [torch.randn(rows, k, device="cuda").bfloat16() for _ in range(4)]
            ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16() for _ in range(COPIES)]
            res = torch.randn(rows, n, device="cuda").bfloat16()
            mb = n * k * 2 / 1e6
            plain = torch.empty(rows, n, device="cuda").bfloat16()
            if with_residual:
                cublas = graph_us(lambda i: res.addmm_(x[i % 4], ws[i].t()), COPIES)
            else:
                cublas = graph_us(lambda i: torch.mm(x[i % 4], ws[i].t(), out=plain), COPIES)
            default = sl.launch_config(rows, n, k)
            results = []
            for cfg in [{}] + grid(quick, k):
                try:
                    if with_residual:
                        us = graph_us(lambda i: sl.splitk_linear(x[i % 4], ws[i], res, out=res, config=cfg), COPIES)
                    else:
                        us = graph_us(lambda i: sl.splitk_linear(x[i % 4], ws[i], out=plain, config=cfg), COPIES)
                except Exception as e:                      # a config the compiler or the SMs cannot take
                    print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                results.append((us, cfg))
            results.sort(key=lambda t: t[0])
            best_us, best = results[0]
            r0 = torch.randn(rows, n, device="cuda").bfloat16() if with_residual else None
            want = x[0].float() @ ws[0].float().t() + (r0.float() if with_residual else 0.0)
            got = sl.splitk_linear(x[0], ws[0], r0, config=best).float()
            default_us = next(us for us, cfg in results if cfg == {})
            op = "addmm_" if with_residual else "mm"
            print(f"rows {rows:3d} {name:7s} N {n} K {k}: cuBLAS {op} {cublas:5.2f} us ({mb / cublas:4.2f} TB/s) | "
                  f"splitk default {default} {default_us:5.2f} | best {best} {best_us:5.2f} "
                  f"({mb / best_us:4.2f} TB/s) | max |diff| vs fp32 {(got - want).abs().max().item():.3g}")
            for us, cfg in results[1:6]:
                print(f"    {us:5.2f} {cfg}")


if __name__ == "__main__":
    main()
