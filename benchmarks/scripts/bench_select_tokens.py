"""GPU time of one fused token draw (voxflow/kernels/select_tokens.py) by num_warps, the top-k radix select's bits a
pass (RADIX_BITS), batch and vocabulary, against the torch pipeline it replaces: CUDA-graph replays of 16
back-to-back draws (one decode step's worth). Top-k 50, no top-p (Qwen3-TTS's sampling defaults). bf16 logits (the
served path's), their radix select deciding 16 key bits (select_tokens.key_bits) and, as before session 23, all 32
(FULL_KEYS): the rows `keys16` / `keys32`. Then the talker's c0 draw with and without the select's stop after the
top 16 key bits (HALF_EXIT).

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

    talker_draw()


def talker_draw() -> None:
    """The talker's c0 draw (talker=: repetition penalty 1.05 on 150 seen ids, EOS barred, the suppressed ids) on bf16
    logits, one row and 16, as served (8 warps): its select decides 32 key bits, with and without the stop after the
    top 16 (select_tokens.HALF_EXIT), at 4, 8 (served) and 16 warps; the ids of all must agree (H200 session 30's
    timeline: 31 us on the c=1 step's critical path, the cp draws ~10)."""
    from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, suppress_mask
    vocab = 3072
    for b in (1, 16):
        g = torch.Generator(device="cuda").manual_seed(b)
        logits = (torch.randn(b, vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
        seen = torch.zeros(b, vocab, dtype=torch.bool, device="cuda")
        seen[:, torch.randperm(vocab, device="cuda", generator=g)[:150]] = True
        talker = (seen, torch.full((b,), 1.05, device="cuda"), torch.full((b,), 40, device="cuda"),
                  torch.zeros(b, dtype=torch.long, device="cuda"), suppress_mask(vocab).cuda(), CODEC_EOS_ID)
        ones = torch.ones(b, dtype=torch.bool, device="cuda")
        args = (logits, ones, torch.full((b,), 0.9, device="cuda"), torch.full((b,), 50, device="cuda"),
                torch.ones(b, dtype=torch.float64, device="cuda"), torch.arange(b, device="cuda") * 7919,
                torch.zeros(b, dtype=torch.long, device="cuda"), 0, False)
        row, ids = [f"talker B={b:3d} V={vocab} keys32"], []
        for half_exit in (False, True):
            select_module.HALF_EXIT = half_exit
            for warps in (4, 8, 16):
                row.append(f"half_exit={'on' if half_exit else 'off'} w{warps} "
                           f"{timed(lambda: select_tokens(*args, talker=talker, num_warps=warps)):5.1f} us")
                ids.append(select_tokens(*args, talker=talker, num_warps=warps))
        select_module.HALF_EXIT = True
        same = all(torch.equal(ids[0], other) for other in ids[1:])
        print("  ".join(row) + ("  ids equal" if same else "  IDS DIFFER"), flush=True)


if __name__ == "__main__":
    main()
