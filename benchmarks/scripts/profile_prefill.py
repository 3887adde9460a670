"""Where a new request's first-packet time goes on the GPU: for requests arriving one at a time (c=1) and N at once,
the engine's TTFP split per request, the host time of each engine step until the first chunk, and a torch profiler
table of the host-side ops of the step that runs the prefill (what the host waits on: syncs, copies, launches).

    python benchmarks/scripts/profile_prefill.py MODEL_DIR [BATCH] [KEY=VALUE engine args]
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import AudioChunk, SamplingOptions, SpeechRequest

TEXT = "Hello there, this is a sentence of ordinary length for the profile."


def request(rid: str) -> SpeechRequest:
    return SpeechRequest(text=f"{TEXT} Number {rid}.", voice="vivian", request_id=rid,
                         sampling=SamplingOptions(max_new_tokens=40, ignore_eos=True))


def until_first_chunks(core: EngineCore, ids: set[str], prof_first: bool) -> list[tuple[float, int]]:
    """Step until every request in `ids` has its first chunk; (host ms, outputs) per step. The first step is profiled
    (host ops) when asked."""
    waiting, steps = set(ids), []
    while waiting:
        t = time.perf_counter()
        if prof_first and not steps:
            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=acts) as prof:
                outs = core.step()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
        else:
            outs = core.step()
        steps.append((round((time.perf_counter() - t) * 1e3, 2), len(outs)))
        waiting -= {o.request_id for o in outs if isinstance(o, AudioChunk)}
    while core.has_work():
        core.step()
    return steps


def main() -> None:
    model = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    extra = parse_engine_args(sys.argv[3:])
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=max(batch, 4))
    cfg.update(extra)
    core = EngineCore.from_config(EngineConfig(**cfg))
    print("startup:", core.startup, flush=True)
    for i in range(4):
        core.add_request(request(str(i)))
        steps = until_first_chunks(core, {str(i)}, prof_first=i == 3)
        print(f"c=1 request {i}: steps until first chunk (host ms, outputs): {steps}")
        print("  engine ttfp_breakdown_ms so far:", core.stats().get("ttfp_breakdown_ms"), flush=True)
    ids = {f"b{i}" for i in range(batch)}
    for rid in ids:
        core.add_request(request(rid))
    steps = until_first_chunks(core, ids, prof_first=True)
    print(f"{batch} at once: steps until every first chunk (host ms, outputs): {steps}")
    print("  engine ttfp_breakdown_ms (all requests so far):", core.stats().get("ttfp_breakdown_ms"))
    if core.prefill_runner is not None:
        print("  prefill graphs:", core.prefill_runner.stats)


if __name__ == "__main__":
    main()
