"""Where the time of one engine step goes on the GPU, at one or more concurrencies:

1. steady-state step time with CUDA graphs, and the host's time per step by engine phase;
2. a torch profiler trace of graph replays: kernels per step, GPU kernel time per step, the top kernels
   (CUPTI lists the kernels inside a graph one by one, so these are the real in-graph durations);
3. (first concurrency only) the same steps run eagerly, grouped by the named ranges of the decode step
   (code_predictor / cp_sampling / talker / c0_sampling) to split the GPU time by stage.

    python benchmarks/scripts/profile_step.py MODEL_DIR CONCURRENCY[,CONCURRENCY...] [--no-eager] [--stagger]
        [KEY=VALUE engine args]

--stagger adds the requests over 25 steps instead of at once. Started together, their codec chunks fall due in the
same step, so the codec's bursts hit 2 of every 50 profiled steps, while in a served run its calls spread over the
steps and run beside most of them (H200 session 25: a GEMM change that took 0.4 ms off this script's step did
nothing to served throughput; served steps that start while the codec runs take ~2x).
"""
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.gc_freeze import freeze_startup_objects
from voxflow.engine.request import SamplingOptions, SpeechRequest

ACTIVITIES = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
TEXT = "Hello there, this is a sentence of ordinary length for the profile."


def engine(model: str, concurrency: int, graphs: bool, extra: dict, stagger: bool = False) -> EngineCore:
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=max(concurrency, 1), cuda_graphs=graphs)
    cfg.update(extra)
    core = EngineCore.from_config(EngineConfig(**cfg))
    freeze_startup_objects()                  # as the server does: no full collections scanning the engine's objects
    spread = 25 if stagger else 1             # steps the arrivals are spread over (a chunk is 25 frames)
    for step in range(30 + spread):           # past the prefills, into the steady state
        for i in range(concurrency * step // spread, concurrency * (step + 1) // spread) if step < spread else ():
            core.add_request(SpeechRequest(text=TEXT, voice="vivian", request_id=str(i),
                                           sampling=SamplingOptions(max_new_tokens=2000, ignore_eos=True)))
        core.step()
    sync()
    return core


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(core: EngineCore, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    sync()
    return (time.perf_counter() - t) / steps * 1e3


def kernel_summary(prof, steps: int, top: int = 25) -> None:
    per_name = defaultdict(lambda: [0, 0.0])
    per_stream = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            row = per_name[e.name]
            row[0] += 1
            row[1] += e.device_time
            per_stream[getattr(e, "device_resource_id", -1)] += e.device_time
    count = sum(c for c, _ in per_name.values()) / steps
    total = sum(t for _, t in per_name.values()) / steps / 1e3
    print(f"  {count:.0f} kernels per step, {total:.2f} ms of kernel time per step; by stream (ms/step): "
          + ", ".join(f"{k}: {v / steps / 1e3:.2f}" for k, v in sorted(per_stream.items())))
    for name, (c, t) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t / steps / 1e3:7.3f} ms  {c / steps:6.1f}x  {t / c:7.1f} us  {name[:110]}")


def main() -> None:
    model = sys.argv[1]
    levels = [int(c) for c in sys.argv[2].split(",")]
    eager = "--no-eager" not in sys.argv[3:]
    stagger = "--stagger" in sys.argv[3:]
    extra = parse_engine_args([a for a in sys.argv[3:] if a not in ("--no-eager", "--stagger")])
    for i, c in enumerate(levels):
        core = engine(model, c, True, extra, stagger)
        before = dict(core.timings)
        ms = timed(core, 50)
        host = {k: round((core.timings[k] - before[k]) / 50 * 1e3, 2) for k in before}
        print(f"c={c} {extra}: {ms:.2f} ms per step with CUDA graphs; host ms/step by phase: {host}", flush=True)
        # 30 steps: long enough to hold a codec burst (at c=64 the streams start together and decode their 25-frame
        # chunks in the same step, every 25 steps).
        with profile(activities=ACTIVITIES[-1:]) as prof:
            timed(core, 30)
        print(f"c={c} graph replays:")
        kernel_summary(prof, 30)
        del core
        sync()
        if i == 0 and eager:
            core = engine(model, c, False, extra)
            with profile(activities=ACTIVITIES) as prof:
                timed(core, 10)
            print(f"c={c} eager, by range (GPU ms per step):")
            for ev in prof.key_averages():
                if ev.key in ("code_predictor", "cp_sampling", "talker", "c0_sampling"):
                    print(f"  {ev.key:15s} {ev.device_time_total / 10 / 1e3:7.3f} ms  calls/step {ev.count / 10:.0f}")
            kernel_summary(prof, 10, top=15)
            del core
            sync()


if __name__ == "__main__":
    main()
