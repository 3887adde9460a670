"""Whether fp8 weights could shorten the 64-row decode GEMMs: bf16 F.linear against torch._scaled_mm with e4m3
operands (per-row activation scales, per-output-channel weight scales, bf16 out) at the code predictor's and the
0.6B talker's layer shapes, and what quantizing the activation rows costs.

Why: a 0.6B c=64 step (~5.7 ms on an H100) is ~60% 64-row GEMMs that read their weights at 1-2 TB/s (session 42:
cuBLAS's gate|up 12.6 MB in ~6.3 us); Triton GEMMs at these sizes reach ~1.3 TB/s (sessions 12, 13, 25, 42), so a
fused Triton path loses more than it saves. Half the weight bytes through cuBLASLt's fp8 kernels is the lever not yet
measured. This script only measures (no engine change): per shape the GPU time a call of each form in CUDA graphs of
CALLS calls on weights rotated past the L2, the quantization's time (row amax, scale, cast: the torch ops a fused
epilogue would replace), and the fp8 output's error against bf16 (max |diff| / max |bf16|).

    python benchmarks/scripts/probe_fp8_gemm.py [ROWS]
"""
from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

COPIES, CALLS = 8, 64
# (name, N, K): the code predictor's layer (hidden 1024; the 0.6B talker's layers have the same shapes)
SHAPES = (("qkv", 4096, 1024), ("o_proj", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072))
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def graph_us(fn, n_inputs: int) -> float:
    """us a call: a CUDA graph of CALLS calls fn(i % n_inputs), 20 replays a round, the median of 5 rounds."""
    for i in range(2):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i % n_inputs)
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / (20 * CALLS))
    return statistics.median(rounds)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 rows and their fp32 scales [rows, 1] (amax / 448 per row)."""
    scale = (t.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (t.float() / scale).to(E4M3), scale


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {rows} rows, bf16 out")
    total_bf16 = total_fp8 = total_q = 0.0
    for name, n, k in SHAPES:
        xs = [torch.randn(rows, k, device="cuda").bfloat16() for _ in range(4)]
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16() for _ in range(COPIES)]
        bf16 = graph_us(lambda i: F.linear(xs[i % 4], ws[i]), COPIES)
        q = [quantize_rows(w) for w in ws]                      # weights: per output channel, made once at load
        w8 = [wq.t() for wq, _ in q]                            # [K, N] column-major, as _scaled_mm takes it
        w_scale = [s.t().contiguous() for _, s in q]            # [1, N]
        xq = [quantize_rows(x) for x in xs]
        try:
            fp8 = graph_us(lambda i: torch._scaled_mm(xq[i % 4][0], w8[i], scale_a=xq[i % 4][1], scale_b=w_scale[i],
                                                      out_dtype=torch.bfloat16), COPIES)
        except Exception as e:                                  # rowwise scales need a recent torch and sm_89+
            print(f"{name}: _scaled_mm failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        quant = graph_us(lambda i: quantize_rows(xs[i % 4]), 4)
        ref = F.linear(xs[0], ws[0]).float()
        got = torch._scaled_mm(xq[0][0], w8[0], scale_a=xq[0][1], scale_b=w_scale[0], out_dtype=torch.bfloat16)
        err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
        mb = n * k * 2 / 1e6
        print(f"{name:8s} N {n:5d} K {k:5d}: bf16 {bf16:6.2f} us ({mb / bf16:4.2f} TB/s) | fp8 {fp8:6.2f} us "
              f"({mb / 2 / fp8:4.2f} TB/s) | quantize rows (torch ops) {quant:5.2f} us | max err {err:.4f}")
        total_bf16, total_fp8, total_q = total_bf16 + bf16, total_fp8 + fp8, total_q + quant
    print(f"a layer's four GEMMs: bf16 {total_bf16:.2f} us, fp8 {total_fp8:.2f} us (+ {total_q:.2f} us of torch-op "
          f"quantization, which a fused epilogue would mostly hide)")


if __name__ == "__main__":
    main()
