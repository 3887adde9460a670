"""Would two half-batches decoding side by side (two CUDA streams) make more frames per second than one batch?

Why ask: at 64 rows the talker's step is a chain of ~1,000 small kernels, each far from the GPU's bandwidth or SM
count (H200 session 24 call 5: every 64-row GEMM 5.7-7.4 us for ~2 us of bytes). Two independent chains on two
streams could fill what one leaves idle.

The probe builds E engines in one process, each with C / E sequences and the talker on a stream of its own
(`talker_high_priority`), fills them with never-ending requests (ignore_eos) and steps them in turn from one thread.
`EngineCore.step` launches step N and then waits for step N - 1, so the other engine's step N runs on the GPU while
the host waits: the engines' steps overlap without threads. Each engine holds its own copy of the weights, so the
two chains read twice the bytes a shared-weights design would: a gain here is a lower bound.

    python benchmarks/scripts/probe_two_batches.py MODEL_DIR TOTAL_CONCURRENCY ENGINES [KEY=VALUE engine args]

Prints frames per second over 100 steps of each engine after 250 warm-up steps (contexts ~300-400 positions, the
KV-table widths all captured by then), and each engine's host ms per step by phase.
"""
import sys
import time

import torch

from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.gc_freeze import freeze_startup_objects
from voxflow.engine.request import SamplingOptions, SpeechRequest

TEXT = "Hello there, this is a sentence of ordinary length for the probe."
WARM_STEPS, STEPS, SPREAD = 250, 100, 25


def build(model: str, seqs: int, extra: dict) -> EngineCore:
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=seqs, talker_high_priority=True)
    cfg.update(extra)
    return EngineCore.from_config(EngineConfig(**cfg))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    model, total, n_engines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    extra = parse_engine_args(sys.argv[4:])
    seqs = total // n_engines
    cores = [build(model, seqs, extra) for _ in range(n_engines)]
    freeze_startup_objects()
    for step in range(WARM_STEPS):
        for e, core in enumerate(cores):
            if step < SPREAD:             # arrivals over 25 steps, so codec chunks fall due in different steps
                for i in range(seqs * step // SPREAD, seqs * (step + 1) // SPREAD):
                    core.add_request(SpeechRequest(
                        text=TEXT, voice="vivian", request_id=f"{e}-{i}",
                        sampling=SamplingOptions(max_new_tokens=4000, ignore_eos=True)))
            core.step()
    sync()
    before = [dict(core.timings) for core in cores]
    t = time.perf_counter()
    for _ in range(STEPS):
        for core in cores:
            core.step()
    sync()
    wall = time.perf_counter() - t
    running = sum(core.scheduler.num_running for core in cores)
    print(f"total c={total} engines={n_engines} ({seqs} seqs each, {running} running) {extra}: "
          f"{wall / STEPS * 1e3:.2f} ms per round of steps, {running * STEPS / wall:.0f} frames/s", flush=True)
    for core, b in zip(cores, before):
        print("  host ms/step by phase:", {k: round((core.timings[k] - b[k]) / STEPS * 1e3, 2) for k in b})


if __name__ == "__main__":
    main()
