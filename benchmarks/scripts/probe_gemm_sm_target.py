"""Do cuBLAS GEMMs planned for fewer SMs (voxflow/engine/gemm_sm_target.py) run faster beside a load that holds
the other SMs? The question behind EngineConfig.talker_gemm_sms, per GEMM of the talker's step, in seconds of
device time instead of a served A/B.

    python benchmarks/scripts/probe_gemm_sm_target.py [--rows 16,32,64] [--targets none,68,64] [--load-sms 64] [--lt]

For each of the 0.6B's (and the code predictor's) and the 1.7B talker's layer GEMMs, at each row count and SM
target: a CUDA graph of REPS such GEMMs (weights rotated through copies larger than L2 together) captured under
that target, timed alone and while a load of large bf16 matmuls runs on a green context of --load-sms SMs (what
the codec's partition holds), and the kernel cuBLAS picked (its name carries the tile and split-K). Prints one row
per (GEMM, rows, target): us per GEMM alone / beside the load. Run it with the targets in both orders: cuBLAS keeps
a heuristics cache, and a kernel that stays the same whatever the order says the target is ignored; one that
follows the first target asked says the cache does not tell targets apart.

Ran as H200 session 35 call 1 (benchmarks/results/h200/2026-12-05-session35/call1): a target changes the kernel,
and every targeted kernel is as fast or slower beside the load than cuBLAS's own; the served A/B gained nothing,
so talker_gemm_sms and voxflow/engine/gemm_sm_target.py were removed after it. This is the record of what ran:
it imports that module, so run it at commit 944b4c8 (`git show 944b4c8:voxflow/engine/gemm_sm_target.py`).
"""
from __future__ import annotations

import argparse

import torch

from voxflow.engine import gemm_sm_target as gst
from voxflow.engine.gemm_sm_target import gemm_sm_target
from voxflow.engine.sm_partition import partitioned_stream

# (name, in features, out features)
GEMMS = [("0.6B q|k|v", 1024, 4096), ("0.6B o_proj", 2048, 1024), ("0.6B gate|up", 1024, 6144),
         ("0.6B down", 3072, 1024), ("1.7B q|k|v", 2048, 4096), ("1.7B o_proj", 2048, 2048),
         ("1.7B gate|up", 2048, 12288), ("1.7B down", 6144, 2048)]
REPS = 48
L2_BYTES = 50 << 20     # H200: 50 MB; the weight copies a graph cycles through take at least twice that
REPLAYS = 10


def kernel_name(x, w) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.nn.functional.linear(x, w)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(n[:48] for n in names) or "?"


def capture(x, weights, target, device, side):
    outs = []
    with gemm_sm_target(target, device):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for w in weights:
                torch.nn.functional.linear(x, w)
        torch.cuda.current_stream().wait_stream(side)
        name = kernel_name(x, weights[0])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(REPS):
                outs.append(torch.nn.functional.linear(x, weights[i % len(weights)]))
    return graph, name, outs


def time_graph(graph, load=None) -> float:
    """us per GEMM over REPLAYS replays; with `load` (a callable that queues work on the load stream) first.
    (Not event_timing.timed: its warm-up call synchronises, which would wait out the load before the timing.)"""
    if load is not None:
        load()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * REPS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="16,32,64")
    ap.add_argument("--targets", default="none,68,64")
    ap.add_argument("--load-sms", type=int, default=64)
    ap.add_argument("--lt", action="store_true", help="targeted captures through cuBLASLt (gemm_sm_target.PREFER_LT)")
    args = ap.parse_args()
    gst.PREFER_LT = args.lt
    device = torch.device("cuda")
    torch.manual_seed(0)
    load_stream, _ = partitioned_stream(device, args.load_sms)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    with torch.cuda.stream(load_stream):
        torch.mm(a, a)                      # the load's own cuBLAS warm-up
    torch.cuda.synchronize()

    def load():
        # ~2 TFLOP per matmul: far longer together than the timed replays, on the load's SMs only
        load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(load_stream):
            for _ in range(24):
                torch.mm(a, a)

    targets = [None if t == "none" else int(t) for t in args.targets.split(",")]
    side = torch.cuda.Stream()          # every capture's warm-up on one stream: one cuBLAS workspace
    print(f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs; "
          f"load on {args.load_sms} SMs; us per GEMM (bf16), graph of {REPS}; targets through "
          f"{'cuBLASLt' if args.lt else 'the cuBLAS handle + the cuBLASLt carveout'}")
    print(f"{'GEMM':14} {'rows':>4} {'target':>6} {'alone':>8} {'beside':>8}  kernel")
    for name, k, n in GEMMS:
        copies = max(2, -(-2 * L2_BYTES // (n * k * 2)))
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            for target in targets:
                graph, kernel, _outs = capture(x, weights, target, device, side)
                alone = time_graph(graph)
                beside = time_graph(graph, load)
                torch.cuda.synchronize()
                print(f"{name:14} {rows:>4} {str(target):>6} {alone:8.2f} {beside:8.2f}  {kernel}", flush=True)
                del graph
        del weights


if __name__ == "__main__":
    main()
