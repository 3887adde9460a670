"""Host time of building one request's prompt (the model's `prepare`, which runs on the engine's thread between
steps): mean over repeated calls, then where it goes (cProfile, top functions by cumulative time) and the CUDA
kernels it launches.

    python benchmarks/scripts/profile_prepare.py MODEL_DIR [device]
"""
import cProfile
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.engine.request import SpeechRequest
from voxflow.models.registry import load_for_engine

TEXT = "Hello there, this is a sentence of ordinary length for the profile."


def main() -> None:
    device = sys.argv[2] if len(sys.argv) > 2 else ("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = load_for_engine(sys.argv[1], device=device, dtype="bfloat16" if device == "cuda" else "float32",
                               max_slots=4)
    req = SpeechRequest(text=TEXT, voice=model.describe()["voices"][0] if model.describe().get("voices") else None)
    for _ in range(10):
        model.prepare(req)
    n = 50
    t = time.perf_counter()
    for _ in range(n):
        model.prepare(req)
    print(f"prepare: {(time.perf_counter() - t) / n * 1e3:.3f} ms of host time each (mean of {n})")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        model.prepare(req)
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
    if device == "cuda":
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model.prepare(req)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
