"""A code-predictor layer's GEMM chain at 64 rows, alone and while the codec decodes beside it: cuBLAS against
`skinny_linear` (Triton, with programmatic dependent launch).

Why: a 0.6B c=64 step is mostly the code predictor's 75 layer passes, each four GEMMs that cost ~4.5 us fixed plus
~0.2 us a MB (session 58's probe_cublaslt_algos.py); cuBLAS's GEMM kernels hold no PDL instructions (session 58's
probe_cublas_pdl.sh), so only a GEMM of our own can overlap its launch with the kernel before. Session 25 routed the
64-row GEMMs through `skinny_linear` + PDL: the step alone 5.64 -> 5.23 ms, but served throughput did not gain, and
the step traces said why only roughly (the fastest steps faster, the median not). Served, about half of the steps
run beside a codec call on its 64-SM green context. This measures the chain in both conditions, so that a GEMM
design can be judged beside the codec without a serving run.

Each variant is LAYERS layer passes of distinct weights (past the L2) captured in one CUDA graph: q|k|v, o_proj +
residual, gate|up, down + residual with silu * up (cuBLAS: F.linear / addmm_ and the silu_mul kernel; skinny: four
skinny_linear launches around the same silu * up kernel, with PDL and the N = 1024 GEMMs split along K in two, the
default since session 61 (skinny_linear.SPLIT_K_BELOW_BLOCKS, the in-kernel fixup); the same unsplit; and without
PDL). Timed as the mean of REPLAYS replays, first alone, then while a thread keeps the codec busy (16 streams x 25-frame calls of random real-size weights, fp16, on --sms SMs).

    python benchmarks/scripts/probe_gemms_beside_codec.py [--sms 64] [--rounds 3] [--shape cp|talker-1.7b] [--rows 64]
"""
from __future__ import annotations

import argparse
import threading
import time

import torch
import torch.nn.functional as F

ROWS, HIDDEN, HEADS_WIDTH, KV_WIDTH, INTER = 64, 1024, 2048, 1024, 3072      # the 0.6B code predictor's layer
# --shape: (hidden, q heads x head_dim, kv heads x head_dim, intermediate) of the layers whose GEMMs are timed
SHAPES = {"cp": (1024, 2048, 1024, 3072),           # either code predictor's layer (and the 0.6B talker's widths)
          "talker-1.7b": (2048, 2048, 1024, 6144)}  # the 1.7B talker's layer (VOXFLOW_TALKER_SKINNY_GEMMS)
LAYERS = 10                                     # 10 x 31.5 MB of weights: past an H100 / H200 L2
REPLAYS = 50
# Beside the codec: enough replays for the window to span many codec calls (~10 ms each). Session 59's first run
# timed 50 replays (~15 ms) there, inside one codec call or none: its "beside" figures equalled the alone ones.
REPLAYS_BESIDE = 1000


def weights(layers: int) -> list[dict]:
    def w(n, k):
        return (torch.randn(n, k, device="cuda") * (0.5 * k ** -0.5)).bfloat16()   # (damped: 10 layers stay finite)
    return [{"qkv": w(HEADS_WIDTH + 2 * KV_WIDTH, HIDDEN), "o": w(HIDDEN, HEADS_WIDTH),
             "gate_up": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER)} for _ in range(layers)]


def cublas_layer(x: torch.Tensor, p: dict) -> torch.Tensor:
    from voxflow.kernels.silu_mul import silu_mul
    qkv = F.linear(x, p["qkv"])
    h = x.addmm(qkv[:, :HEADS_WIDTH], p["o"].t())                      # (the attention's output stands in)
    gate_up = F.linear(h, p["gate_up"])
    act = silu_mul(gate_up[:, :INTER], gate_up[:, INTER:])
    return h.addmm_(act, p["down"].t())


def skinny_layer(x: torch.Tensor, p: dict) -> torch.Tensor:
    """The same chain with skinny_linear's four GEMMs (the residual adds in their epilogues) and the same silu * up
    kernel between gate|up and down: skinny_linear's gated prologue is recomputed by each of its programs, which
    at 64 rows costs far more than the launch it saves (qwen3_layer.SKINNY_PROLOGUE_MAX_ROWS)."""
    from voxflow.kernels.silu_mul import silu_mul
    from voxflow.kernels.skinny_linear import skinny_linear
    qkv = skinny_linear(x, p["qkv"])
    h = skinny_linear(qkv[:, :HEADS_WIDTH], p["o"], residual=x)          # (a unit last stride is all it needs)
    gate_up = skinny_linear(h, p["gate_up"])
    act = silu_mul(gate_up[:, :INTER], gate_up[:, INTER:])
    return skinny_linear(act, p["down"], residual=h, out=h)


def graphed(layer, ps: list[dict]) -> torch.cuda.CUDAGraph:
    x = torch.randn(ROWS, HIDDEN, device="cuda").bfloat16()

    def chain():
        h = x
        for p in ps:
            h = layer(h, p)
        return h
    want = chain()                                      # (compiles the Triton kernels outside the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain()
    graph.replay()
    torch.cuda.synchronize()
    err = (got.float() - want.float()).abs().max().item()
    if err:
        print(f"note: {layer.__name__}'s graph replay differs from its eager chain by up to {err:.3g}")
    return graph


def us_per_layer(graph: torch.cuda.CUDAGraph, replays: int = REPLAYS) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * LAYERS)


class CodecLoad:
    """A thread that keeps the codec's green-context stream busy with 16-stream 25-frame calls until stopped."""

    def __init__(self, sms: int):
        from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
        from voxflow.tools.codec_snr import random_real_codec_decoder
        self.runner = Qwen3CodecRunner.from_decoder(random_real_codec_decoder("cuda").half(), max_rows=16,
                                                    stream_sms=sms)
        self.states = [self.runner.new_state(None) for _ in range(16)]
        self.frames = [torch.randint(0, 2048, (25, 16), device="cuda") for _ in range(16)]
        self.runner.decode(self.states, self.frames)                   # (captures its graph)
        torch.cuda.synchronize()
        # The runner's codec stream waits for what is queued on the caller's current stream: from the default stream
        # it waited for every timed replay, so sessions 59-60 saw <= 1 codec call end in the window. Its own stream.
        self.side = torch.cuda.Stream()
        self.calls, self._stop, self._thread = 0, threading.Event(), None

    def __enter__(self):
        # (A fresh stop flag each window: sessions 60-61's probe set it on the first exit and never cleared it, so
        # every later window ran without the codec.)
        self._stop = threading.Event()

        def loop():
            with torch.cuda.stream(self.side):
                while not self._stop.is_set():
                    self.runner.decode(self.states, self.frames)
                    self.calls += 1
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        time.sleep(0.05)                                                # (the first call under way)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main() -> None:
    global ROWS, HIDDEN, HEADS_WIDTH, KV_WIDTH, INTER
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=64, help="the codec's green-context SMs (as codec_sms)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="cp", help="the layer widths (default: cp)")
    ap.add_argument("--rows", type=int, default=ROWS, help="rows a GEMM (<= 64, skinny_linear's most)")
    args = ap.parse_args()
    ROWS = args.rows
    HIDDEN, HEADS_WIDTH, KV_WIDTH, INTER = SHAPES[args.shape]
    torch.manual_seed(0)
    ps = weights(LAYERS)
    from voxflow.kernels import pdl_enabled, set_pdl_enabled
    from voxflow.kernels import skinny_linear as sk
    split_below = sk.SPLIT_K_BELOW_BLOCKS   # (the launch config reads it at launch, so each graph keeps its choice)
    sk.SPLIT_K_BELOW_BLOCKS = 96            # (the N = 1024 GEMMs split K in two, as "auto" on 132 SMs)
    graphs = {"cublas": graphed(cublas_layer, ps), "skinny+pdl+splitk": graphed(skinny_layer, ps)}
    sk.SPLIT_K_BELOW_BLOCKS = 0
    graphs["skinny+pdl"] = graphed(skinny_layer, ps)
    if pdl_enabled():               # (the switch is read at launch, so a graph captured with it off keeps it off)
        set_pdl_enabled(False)
        graphs["skinny"] = graphed(skinny_layer, ps)
        set_pdl_enabled(True)
    sk.SPLIT_K_BELOW_BLOCKS = split_below
    load = CodecLoad(args.sms)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: us a {ROWS}-row {args.shape} layer pass "
          f"(4 GEMMs + silu * up), "
          f"{LAYERS} layers x {REPLAYS} replays alone, {REPLAYS_BESIDE} beside the codec (on {args.sms} SMs)")
    for r in range(args.rounds):
        for name, graph in graphs.items():
            graph.replay()                                              # (warm)
            alone = us_per_layer(graph)
            with load:
                calls = load.calls
                beside = us_per_layer(graph, REPLAYS_BESIDE)
                calls = load.calls - calls
            print(f"round {r + 1} {name:17s} alone {alone:6.2f}  beside the codec {beside:6.2f}  "
                  f"({calls} codec calls ended in that window)", flush=True)


if __name__ == "__main__":
    main()
