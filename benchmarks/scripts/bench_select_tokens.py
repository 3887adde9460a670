"""GPU time of one fused token draw (voxflow/kernels/select_tokens.py) by num_warps, the top-k radix select's bits a
pass (RADIX_BITS), batch and vocabulary, against the torch pipeline it replaces: CUDA-graph replays of 16
back-to-back draws (one decode step's worth). Top-k 50, no top-p (Qwen3-TTS's sampling defaults). bf16 logits (the
served path's), their radix select deciding 16 key bits (select_tokens.key_bits) and, as before session 23, all 32
(FULL_KEYS): the rows `keys16` / `keys32`.

    python benchmarks/scripts/bench_select_tokens.py
"""
import torch

import voxflow.kernels.select_tokens as select_module
from voxflow.kernels.select_tokens import select_tokens
from voxflow.models.qwen3_tts.batch_sampling import gumbel_argmax
from voxflow.models.qwen3_tts.sampling import WarpParams, warp_logits


def timed(fn, reps=20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(16):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 16 * 1e3       # us per draw


def main() -> None:
    for b, vocab, full in [(b, v, f) for b in (1, 16, 64) for v in (2048, 3072) for f in (False, True)]:
        select_module.FULL_KEYS = full
        logits = torch.randn(b, vocab, device="cuda", dtype=torch.bfloat16)
        p = WarpParams(torch.ones(b, dtype=torch.bool, device="cuda"), torch.full((b,), 0.9, device="cuda"),
                       torch.full((b,), 50, dtype=torch.long, device="cuda"),
                       torch.ones(b, dtype=torch.float64, device="cuda"), top_k_max=64, any_top_p=False)
        keys = torch.arange(b, device="cuda")
        frame = torch.zeros(b, dtype=torch.long, device="cuda")
        row = [f"B={b:3d} V={vocab} keys{32 if full else 16}"]
        # (session 11 call 2 compared radix bits 1 / 2 / 4 at 2-16 warps: 2 bits at 8 warps won; with half the
        # passes, 4 warps again)
        for warps, bits in ((4, 2), (8, 2)):
            us = timed(lambda: select_tokens(logits, p.do_sample, p.temperature, p.top_k, p.top_p, keys,
                                             frame, 3, False, num_warps=warps, radix_bits=bits))
            row.append(f"w{warps} r{bits} {us:5.1f}")
        torch_us = timed(lambda: torch.where(p.do_sample, gumbel_argmax(warp_logits(logits.float(), p), keys,
                                                                         frame, 3), logits.float().argmax(-1)))
        row.append(f"torch {torch_us:6.1f} us")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
