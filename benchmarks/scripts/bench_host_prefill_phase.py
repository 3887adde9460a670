"""Host cost of a wave's prefill phase on the engine thread, the model's forward left out: what the engine does
between scheduling a step's new prompts and the prefill replay (attach to slots and codec streams, the packed run's
inputs, the first c0 draw). On a GPU every tensor operation there is a launch of a few microseconds on the engine
thread, in series with the step; the H200 0.6B c=64 trace spent 0.35-1 ms a prompt there (session 36 call 3).

Runs a tiny checkpoint on the CPU: 64 requests arriving together (max_num_seqs 64, a 4,096-position step budget,
the packed prefill), the runner's replay replaced by a zero output (the forward, asynchronous on a GPU), and
reports per prefill step its chunks, its host milliseconds and its top-level tensor operations (torch.profiler),
median of ROUNDS waves.

    python benchmarks/scripts/bench_host_prefill_phase.py TINY_MODEL_DIR [rounds]
"""
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.workloads import load_prompts
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import SamplingOptions, SpeechRequest


def main() -> None:
    torch.set_num_threads(1)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    core = EngineCore.from_config(EngineConfig(model=sys.argv[1], max_num_seqs=64, max_num_batched_tokens=4096,
                                               prefill_graphs=True, packed_prefill=True, num_kv_blocks=4096,
                                               block_size=16))
    runner = core.prefill_runner
    hidden = core.model.prefill_input_spec()[0]
    runner._replay = lambda key: torch.zeros(runner.max_chunks, hidden)       # the forward left out
    texts = [p.text for p in load_prompts()]
    voice = core.model.describe()["voices"][0]

    def wave(tag: str) -> None:
        for i in range(64):
            core.add_request(SpeechRequest(text=f"{texts[i % len(texts)]} {tag}{i}", voice=voice,
                                           request_id=f"{tag}{i}",
                                           sampling=SamplingOptions(greedy=True, max_new_tokens=3)))
        while core.has_work():
            core.step()

    run_prefills = core._run_prefills
    timed: dict[int, list[float]] = defaultdict(list)            # step index in the wave -> ms
    chunks: dict[int, int] = {}
    ops: dict[int, int] = {}

    def measured(step_chunks):
        t = time.perf_counter()
        run_prefills(step_chunks)
        timed[measured.index].append((time.perf_counter() - t) * 1e3)
        chunks[measured.index] = len(step_chunks)
        measured.index += 1
    wave("warm")
    core._run_prefills = measured
    for r in range(rounds):
        measured.index = 0
        wave(f"r{r}_")

    def profiled(step_chunks):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_prefills(step_chunks)
        ops[profiled.index] = sum(e.name.startswith("aten::") and e.cpu_parent is None for e in prof.events())
        profiled.index += 1
    profiled.index = 0
    core._run_prefills = profiled
    wave("ops")
    print("| prefill step of the wave | chunks | host ms (median) | ms a chunk | tensor ops | ops a chunk |")
    print("|---|---|---|---|---|---|")
    for i in sorted(chunks):
        ms = statistics.median(timed[i])
        print(f"| {i + 1} | {chunks[i]} | {ms:.2f} | {ms / chunks[i]:.3f} | {ops.get(i, 0)} | "
              f"{ops.get(i, 0) / chunks[i]:.1f} |")


if __name__ == "__main__":
    main()
