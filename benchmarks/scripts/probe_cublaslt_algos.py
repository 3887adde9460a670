"""Whether cuBLASLt has faster algorithms than the one torch gets for the 64-row decode GEMMs.

Why: at 0.6B c=64 a layer's four GEMMs (q|k|v, o_proj + residual, gate|up, down + residual) take ~28 us on an H100
for 31.5 MB of weights, ~1.1 TB/s (session 46's probe_gemm_layouts), and the code predictor runs 75 layer passes a
frame, the talker 28: ~2.8 ms of a ~5.5 ms step. torch takes cuBLAS's first heuristic choice; cuBLASLt's heuristic
query returns several candidates (tiles, split-K, stages), and the first is a model's guess, not a measurement.
This script only measures: per shape, every candidate's GPU time in CUDA graphs of CALLS calls on weights rotated
past the L2, against torch's call; then a layer's four GEMMs in sequence with each shape's fastest candidate.
cuBLASLt is reached through ctypes (the library torch itself loaded); the structs are the documented C ones.

    python benchmarks/scripts/probe_cublaslt_algos.py [ROWS...]
"""
from __future__ import annotations

import ctypes
import sys

import torch
import torch.nn.functional as F

from probe_fp8_gemm import SHAPES, graph_us

COPIES = 24                     # weight copies rotated through: 24 x 4.2 MB (o_proj) is twice an H100 / H200 L2
WORKSPACE = 32 << 20
CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF = 68, 0, 14
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
OP_N, OP_T = 0, 1


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_cublaslt() -> ctypes.CDLL:
    """The libcublasLt torch loaded (a matmul first makes sure it is mapped)."""
    a = torch.randn(8, 8, device="cuda").bfloat16()
    torch.mm(a, a)
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcublasLt" in line}
    if not paths:
        raise RuntimeError("libcublasLt is not mapped in this process")
    return ctypes.CDLL(sorted(paths)[0])


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cublasStatus {status}")


class LtGemm:
    """D[rows, n] = x[rows, k] @ w[n, k]^T (+ beta * C) in bf16, fp32 accumulate: column-major D^T = op_T(w) @ x^T."""

    def __init__(self, lt: ctypes.CDLL, handle: ctypes.c_void_p, rows: int, n: int, k: int, workspace: torch.Tensor):
        self.lt, self.handle, self.workspace = lt, handle, workspace
        self.desc = ctypes.c_void_p()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")
        for attr, op in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
            v = ctypes.c_int32(op)
            check(lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4), "trans")
        self.a, self.b, self.c = (self._layout(k, n, k), self._layout(k, rows, k), self._layout(n, rows, n))
        self.alpha, self.beta0, self.beta1 = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_float(1.0)

    def _layout(self, r: int, c: int, ld: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        check(self.lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), CUDA_R_16BF, ctypes.c_uint64(r),
                                                 ctypes.c_uint64(c), ctypes.c_int64(ld)), "layout")
        return lay

    def candidates(self, count: int = 64) -> list[Heuristic]:
        pref = ctypes.c_void_p()
        check(self.lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        ws = ctypes.c_uint64(WORKSPACE)
        check(self.lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8), "ws")
        results, returned = (Heuristic * count)(), ctypes.c_int(0)
        check(self.lt.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.a, self.b, self.c, self.c, pref,
                                                     count, results, ctypes.byref(returned)), "heuristic")
        self.lt.cublasLtMatmulPreferenceDestroy(pref)
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def __call__(self, h: Heuristic, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, add: bool) -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        beta = self.beta1 if add else self.beta0
        check(self.lt.cublasLtMatmul(self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(w.data_ptr()),
                                     self.a, ctypes.c_void_p(x.data_ptr()), self.b, ctypes.byref(beta),
                                     ctypes.c_void_p(out.data_ptr()), self.c, ctypes.c_void_p(out.data_ptr()), self.c,
                                     ctypes.byref(h.algo), ctypes.c_void_p(self.workspace.data_ptr()),
                                     ctypes.c_size_t(WORKSPACE), stream), "matmul")


def algo_id(h: Heuristic) -> str:
    """The algorithm's first words (id, tile, stages / split-K packed by cuBLASLt): enough to tell candidates apart."""
    return "-".join(f"{v:x}" for v in list(h.algo.data)[:3])


def main() -> None:
    rows_list = [int(a) for a in sys.argv[1:]] or [64]
    torch.manual_seed(0)
    lt = load_cublaslt()
    handle = ctypes.c_void_p()
    check(lt.cublasLtCreate(ctypes.byref(handle)), "create")
    workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, us a call (graphs of CALLS calls, "
          f"{COPIES} weight copies rotated past the L2)")
    for rows in rows_list:
        best_total, torch_total, first_total = 0.0, 0.0, 0.0
        for name, n, k in SHAPES:
            add = name in ("o_proj", "down")
            xs = [torch.randn(rows, k, device="cuda").bfloat16() for _ in range(4)]
            ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16() for _ in range(COPIES)]
            res = torch.randn(rows, n, device="cuda").bfloat16()
            outs = [res.clone() for _ in range(4)]
            if add:
                ref_fn = lambda i: outs[i % 4].addmm_(xs[i % 4], ws[i].t())         # noqa: E731 (as served)
            else:
                ref_fn = lambda i: torch.mm(xs[i % 4], ws[i].t(), out=outs[i % 4])  # noqa: E731
            t_torch = graph_us(ref_fn, COPIES)
            want = F.linear(xs[0].float(), ws[0].float()) + (res.float() if add else 0.0)
            gemm = LtGemm(lt, handle, rows, n, k, workspace)
            timed = []
            for h in gemm.candidates():
                out = res.clone()
                try:
                    gemm(h, xs[0], ws[0], out, add)
                    torch.cuda.synchronize()
                except RuntimeError as e:
                    print(f"  {name} {algo_id(h)}: {e}")
                    continue
                err = (out.float() - want).abs().max().item()
                us = graph_us(lambda i: gemm(h, xs[i % 4], ws[i], outs[i % 4], add), COPIES)
                timed.append((us, algo_id(h), h.workspaceSize, h.wavesCount, err))
            if not timed:
                print(f"rows {rows} {name}: no candidate ran")
                continue
            mb = n * k * 2 / 1e6
            print(f"rows {rows} {name} (N {n}, K {k}, {mb:.1f} MB): torch {t_torch:.2f} us "
                  f"({mb / t_torch:.2f} TB/s); {len(timed)} cuBLASLt candidates, heuristic order:")
            for us, ident, wsz, waves, err in timed:
                print(f"    {us:7.2f} us  {mb / us:5.2f} TB/s  algo {ident}  workspace {wsz}  waves {waves:.2f}  "
                      f"max |err| {err:.3g}")
            best = min(timed)
            print(f"  best {best[0]:.2f} us ({best[1]}), first {timed[0][0]:.2f}, torch {t_torch:.2f}")
            best_total += best[0]
            first_total += timed[0][0]
            torch_total += t_torch
        print(f"rows {rows}: a layer's four GEMMs torch {torch_total:.2f} us, cuBLASLt first candidate "
              f"{first_total:.2f}, best candidates {best_total:.2f} ({100 * (best_total / torch_total - 1):+.1f}%)")


if __name__ == "__main__":
    main()
