"""Whether cuBLAS picks faster kernels for the 64- and 128-row decode GEMMs when the weight is stored the other way
round, or when bf16 split-K reductions in reduced precision are disallowed.

Why: a 0.6B c=64 step (~5.6 ms on an H100) is mostly the code predictor's 75 layer passes, whose four GEMMs read
their weights at 0.7-1.4 TB/s (o_proj 6.1 us for 4.2 MB, down 7.1 us plus a 2.1 us split-K reduce for 6.3 MB:
session 40's timeline). cuBLAS chooses its kernel by the problem's layout: F.linear's x @ W^T (W [N, K], "TN") is
one problem, x @ Wt with Wt [K, N] stored contiguous ("NN") another, and a layout the heuristics serve better would
be a load-time transpose. This script only measures: per shape and row count, the GPU time of a call of each form in
CUDA graphs of CALLS calls on weights rotated past the L2, and the result's difference from F.linear's.

    python benchmarks/scripts/probe_gemm_layouts.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from probe_fp8_gemm import SHAPES, graph_us

# Weight copies rotated through: 24 x 4.2 MB (o_proj) is twice an H100 / H200 L2 (probe_fp8_gemm's 8 would fit).
COPIES = 24


def forms(x: list[torch.Tensor], ws: list[torch.Tensor], wts: list[torch.Tensor], res: torch.Tensor | None) -> dict:
    """name -> fn(i) for graph_us; i picks the weight copy (and an input). With `res` (o_proj, down: the layer adds
    the residual inside the GEMM, qwen3_layer._forward_folded's addmm) the forms add it, out of place."""
    if res is not None:
        return {
            "addmm (W^T view, as served)": lambda i: torch.addmm(res, x[i % 4], ws[i].t()),
            "addmm (Wt [K,N])": lambda i: torch.addmm(res, x[i % 4], wts[i]),
            "F.linear (W [N,K]), no add": lambda i: F.linear(x[i % 4], ws[i]),
        }
    return {
        "F.linear (W [N,K], as served)": lambda i: F.linear(x[i % 4], ws[i]),
        "mm (Wt [K,N])": lambda i: torch.mm(x[i % 4], wts[i]),
    }


def main() -> None:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, us a call (graphs of CALLS calls, "
          f"{COPIES} weight copies rotated past the L2)")
    matmul = torch.backends.cuda.matmul
    for rows in (64, 128):
        totals: dict[str, float] = {}
        for name, n, k in SHAPES:
            x = [torch.randn(rows, k, device="cuda").bfloat16() for _ in range(4)]
            ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16() for _ in range(COPIES)]
            wts = [w.t().contiguous() for w in ws]
            res = torch.randn(rows, n, device="cuda").bfloat16() if name in ("o_proj", "down") else None
            ref = F.linear(x[0], ws[0]).float() + (res.float() if res is not None else 0.0)
            line = []
            for reduced in (True, False):
                matmul.allow_bf16_reduced_precision_reduction = reduced
                for form, fn in forms(x, ws, wts, res).items():
                    us = graph_us(fn, COPIES)
                    diff = (fn(0).float() - ref).abs().max().item() if "no add" not in form else float("nan")
                    key = f"{form}{'' if reduced else ', fp32 split-K'}"
                    kind = "as served" if "as served" in form else "Wt [K,N]" if "[K,N]" in form else "other"
                    total = f"{kind}{'' if reduced else ', fp32 split-K'}"
                    totals[total] = totals.get(total, 0.0) + us
                    line.append(f"{key} {us:5.2f} ({n * k * 2 / 1e6 / us:4.2f} TB/s, diff {diff:.1e})")
            matmul.allow_bf16_reduced_precision_reduction = True
            print(f"rows {rows:3d} {name:8s} N {n:5d} K {k:5d}: " + " | ".join(line))
        print(f"rows {rows:3d}, a layer's four GEMMs: " + " | ".join(f"{k} {v:.2f}" for k, v in totals.items()))


if __name__ == "__main__":
    main()
