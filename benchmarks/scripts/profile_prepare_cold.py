"""A fresh model's prompt builds of the bench's measured prompts, first sight against second: where a server's
first run pays (H200 session 24 call 6: a fresh server's first HTTP c=16 run had prepare 3-4x longer than its
second, with the same prompts). Each pass builds the prompts one at a time (as requests arriving apart do), timed
one by one; the first pass also runs under cProfile, and the projected text rows kept per token id
(models/qwen3_tts/text_rows.py) are counted before and after.

    python benchmarks/scripts/profile_prepare_cold.py MODEL_DIR [NUM_PROMPTS] [device]

On a CPU the text rows are kept too (as on a GPU), so the script exercises the serving path anywhere.
"""
import cProfile
import pstats
import statistics
import sys
import time

import torch

from voxflow.bench.workloads import load_prompts, ordered, select
from voxflow.engine.request import SpeechRequest
from voxflow.models.registry import load_for_engine


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def one_pass(model, requests, device: str) -> list[float]:
    """ms of host time per prompt build, the device synced after each (a build's uploads are asynchronous)."""
    out = []
    for req in requests:
        t = time.perf_counter()
        model.prepare(req)
        sync(device)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def text_rows_kept(model) -> int:
    rows = getattr(model.model.talker, "_text_rows", None)
    return rows.projected if rows is not None else 0


def main() -> None:
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    device = sys.argv[3] if len(sys.argv) > 3 else ("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = load_for_engine(sys.argv[1], device=device, dtype="bfloat16" if device == "cuda" else "float32",
                               max_slots=4)
    model.model.talker.keep_text_rows = True
    voices = model.describe().get("voices") or [None]
    prompts = ordered(select(load_prompts("bundled")), count, 0)          # voxflow bench's measured prompts
    warm = ordered(select(load_prompts("bundled")), 4, 1000)              # and its warm-ups
    requests = [SpeechRequest(text=p.text, voice=voices[0]) for p in prompts]
    one_pass(model, [SpeechRequest(text=p.text, voice=voices[0]) for p in warm], device)
    before = text_rows_kept(model)
    prof = cProfile.Profile()
    prof.enable()
    first = one_pass(model, requests, device)
    prof.disable()
    after = text_rows_kept(model)
    second = one_pass(model, requests, device)
    for name, ms in (("first", first), ("second", second)):
        print(f"{name:6s} pass: {len(ms)} builds, ms mean {statistics.mean(ms):.2f} median {statistics.median(ms):.2f} "
              f"max {max(ms):.2f}", flush=True)
    print(f"text ids projected in the first pass: {after - before} (second pass: "
          f"{text_rows_kept(model) - after})")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
