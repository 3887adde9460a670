"""Where the engine thread's host time goes in served steps: cProfile over steady-state steps at one concurrency.

Session 20 call 1's step traces: a step that launches codec chunks spends ~2 ms of host time in `codec_launch` (and
offline ~2 ms in `codec_collect`), serial with the engine's other work, for ~13 chunks. This profiles STEPS steps
after the prefills (requests long enough never to finish) and prints the functions by own time and by cumulative
time, the codec's and the executor's first.

    python benchmarks/scripts/profile_host_step.py MODEL_DIR CONCURRENCY [STEPS] [KEY=VALUE engine args]
"""
import cProfile
import pstats
import sys

import torch

from probe_common import add_requests, build_engine
from voxflow.engine.gc_freeze import freeze_startup_objects


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    rest = sys.argv[3:]
    steps = int(rest.pop(0)) if rest and rest[0].isdigit() else 200
    core = build_engine(model, concurrency, rest, "cuda" if torch.cuda.is_available() else "cpu")
    freeze_startup_objects()
    add_requests(core, concurrency, steps + 100)
    for _ in range(30):
        core.step()
    before = dict(core.timings)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        core.step()
    prof.disable()
    host = {k: round((core.timings[k] - before[k]) / steps * 1e3, 3) for k in before}
    print(f"c={concurrency}, {steps} steps: host ms per step by phase {host}")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(r"codec|engine\.py|inflight", 40)


if __name__ == "__main__":
    main()
