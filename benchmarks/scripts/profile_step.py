"""Where the time of one engine step goes on the GPU: steady-state step time with CUDA graphs, then a torch
profiler table of the same steps run eagerly (inside a graph the kernels are not listed one by one; their GPU
time is the same, only the launch gaps differ).

    python benchmarks/scripts/profile_step.py MODEL_DIR CONCURRENCY [codec_dtype]
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import SamplingOptions, SpeechRequest

TEXT = "Hello there, this is a sentence of ordinary length for the profile."


def engine(model: str, concurrency: int, graphs: bool, codec_dtype: str) -> EngineCore:
    core = EngineCore.from_config(EngineConfig(model=model, device="cuda", dtype="bfloat16", max_num_seqs=concurrency,
                                               cuda_graphs=graphs, codec_dtype=codec_dtype))
    for i in range(concurrency):
        core.add_request(SpeechRequest(text=TEXT, voice="vivian", request_id=str(i),
                                       sampling=SamplingOptions(max_new_tokens=1000, ignore_eos=True)))
    for _ in range(30):                       # past the prefills, into the steady state
        core.step()
    torch.cuda.synchronize()
    return core


def timed(core: EngineCore, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    codec_dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
    core = engine(model, concurrency, True, codec_dtype)
    before = dict(core.timings)
    ms = timed(core, 50)
    host = {k: round((core.timings[k] - before[k]) / 50 * 1e3, 2) for k in before}
    print(f"c={concurrency} codec={codec_dtype}: {ms:.2f} ms per step with CUDA graphs; host ms/step by phase: {host}")
    del core
    torch.cuda.empty_cache()
    core = engine(model, concurrency, False, codec_dtype)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed(core, 10)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
