"""The talker's decode attention for one step at 0.6B c=64 shapes, bf16 pages against fp8 ones (kv_cache_dtype):
28 layers' calls of paged_decode_attention (16 query / 8 KV heads, head_dim 128, 16-position pages), each layer
on its own pool (a step reads every layer's pages once: nothing stays in L2 between layers), replayed from one
CUDA graph; the new token appended as the engine does. Contexts: uniform over [PROMPT, PROMPT + 151) positions
(a closed-loop run's rows are spread over their 150 frames; the bench prompts' ~171 positions). Besides the
defaults, fp8 at other tiles / warps / splits: its tensor-core variant compiles to 234 registers a thread against
bf16's 158 on sm_90 (compile_check), two programs an SM instead of three.

    python benchmarks/scripts/probe_kv_fp8.py [ROWS] [PROMPT] [--regs]
"""
import sys

import torch
from event_timing import timed

from voxflow.kernels.paged_decode_attention import paged_decode_attention

LAYERS, HQ, HKV, D, BS = 28, 16, 8, 128, 16
# (label, dtype, launch overrides): the defaults, then fp8 tiles / warps / splits around them
VARIANTS = [("bf16", torch.bfloat16, {}), ("fp8", torch.float8_e4m3fn, {}),
            ("fp8 32x8w", torch.float8_e4m3fn, dict(block_n=32, num_warps=8)),
            ("fp8 64x8w", torch.float8_e4m3fn, dict(block_n=64, num_warps=8)),
            ("fp8 2 splits", torch.float8_e4m3fn, dict(num_splits=2)),
            ("fp8 16x4w", torch.float8_e4m3fn, dict(block_n=16, num_warps=4))]
# --regs: the tensor-core variant capped at fewer registers a thread (compile_check, sm_90: bf16 158 -> 127 at a cap
# of 128 without spilling, so four programs an SM: 64 rows x 8 KV heads = 512 programs in one wave of 528 slots on
# 132 SMs instead of 1.3 waves of 396), more launch stages, and the tile loop pipelined (loop_stages).
# (The plain loop's variants name loop_stages=1: the pipelined loop is the default since session 51.)
PLAIN = dict(loop_stages=1)
REGS_VARIANTS = [("bf16", torch.bfloat16, PLAIN), ("bf16 maxnreg 128", torch.bfloat16, dict(PLAIN, maxnreg=128)),
                 ("bf16 maxnreg 128 3 stages", torch.bfloat16, dict(PLAIN, maxnreg=128, num_stages=3)),
                 ("bf16 3 stages", torch.bfloat16, dict(PLAIN, num_stages=3)),
                 ("bf16 maxnreg 128 2 splits", torch.bfloat16, dict(PLAIN, maxnreg=128, num_splits=2)),
                 ("fp8", torch.float8_e4m3fn, PLAIN),
                 ("fp8 maxnreg 168", torch.float8_e4m3fn, dict(PLAIN, maxnreg=168)),
                 # the tile loop software-pipelined (compile_check: 2 stages, cp.async, 128 registers, no spill)
                 ("bf16 loop 2 stages", torch.bfloat16, dict(loop_stages=2)),
                 ("bf16 loop 3 stages", torch.bfloat16, dict(loop_stages=3)),
                 ("bf16 loop 3 stages maxnreg 128", torch.bfloat16, dict(loop_stages=3, maxnreg=128)),
                 ("fp8 loop 2 stages", torch.float8_e4m3fn, dict(loop_stages=2))]


def make_pools(dtype, rows, width):
    gen = torch.Generator("cuda").manual_seed(0)
    return [(torch.randn(rows * width + 1, BS, HKV, D, device="cuda", generator=gen).to(dtype),
             torch.randn(rows * width + 1, BS, HKV, D, device="cuda", generator=gen).to(dtype))
            for _ in range(LAYERS)]


def step_graph(pools, rows, lens, launch):
    width = pools[0][0].shape[0] // rows
    dtype = pools[0][0].dtype
    gen = torch.Generator("cuda").manual_seed(1)
    tables = torch.arange(rows * width, device="cuda").view(rows, width)
    last = lens - 1
    slots = tables.gather(1, (last // BS)[:, None])[:, 0] * BS + last % BS
    q = torch.randn(rows, HQ, D, device="cuda", generator=gen).to(torch.bfloat16)
    k_new = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(dtype)
    v_new = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(dtype)

    def run():
        for k_pool, v_pool in pools:
            paged_decode_attention(q, k_pool, v_pool, tables, lens, D ** -0.5, k_new=k_new, v_new=v_new,
                                   slots=slots, **launch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()                                      # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.inputs = (q, tables, slots, k_new, v_new)     # a graph holds no reference to what it reads: kept alive
    return graph


def time_graph(graph, reps=200):
    for _ in range(20):
        graph.replay()
    return timed(graph.replay, reps)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    variants = REGS_VARIANTS if "--regs" in sys.argv else VARIANTS
    rows = int(args[0]) if args else 64
    prompt = int(args[1]) if len(args) > 1 else 171
    gen = torch.Generator().manual_seed(1)
    lens = torch.randint(prompt, prompt + 151, (rows,), generator=gen).cuda()
    width = -(-int(lens.max()) // BS)
    print(f"{rows} rows, contexts {int(lens.min())}-{int(lens.max())} (mean {lens.float().mean():.0f}), "
          f"{LAYERS} layers, {torch.cuda.get_device_name()}")
    pools = {dtype: make_pools(dtype, rows, width) for dtype in (torch.bfloat16, torch.float8_e4m3fn)}
    graphs = {}
    for label, dtype, launch in variants:
        try:
            graphs[label] = (step_graph(pools[dtype], rows, lens, launch), dtype)
        except Exception as e:                     # a launch the kernel refuses: say so, keep the others
            print(f"{label}: {type(e).__name__}: {e}")
    for rnd in range(3):                           # alternating, three rounds
        for label, (graph, dtype) in graphs.items():
            ms = time_graph(graph)
            kv_bytes = LAYERS * 2 * int(lens.sum()) * HKV * D * torch.finfo(dtype).bits // 8
            print(f"round {rnd} {label}: {ms:.3f} ms a step's attention ({ms / LAYERS * 1e3:.1f} us a layer), "
                  f"{kv_bytes / ms / 1e9:.2f} TB/s of K/V")


if __name__ == "__main__":
    main()
