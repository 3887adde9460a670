"""Where the host's time goes when the engine launches a codec chunk (`Qwen3CodecRunner.decode_async`).

H200 session 31's c=1 step traces: a codec launch took 0.9-1.25 ms of host time (`codec_launch`), on the critical
path of every request twice -- its first chunk (TTFP) and its final chunk (E2E, with the talker idle) -- while the
GPU work it queues is graph replays. This builds the codec runner as the engine does (the checkpoint's codec, fp16
where the load-time check allows, CUDA graphs, the "auto" SM partition), captures its shapes, then, per chunk size
(1, 25 and a final 20-frame chunk), times the host side of decode_async alone (the GPU is drained between calls, so
nothing waits on it) and prints cProfile's top functions over a run of calls.

    python benchmarks/scripts/profile_codec_launch.py /tmp/real-1.7b
"""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from voxflow.models.qwen3_tts.engine_loader import load


def frames_on_device(n: int) -> torch.Tensor:
    """[n, 16] codes as the engine's frames are: a device tensor the talker's step made."""
    return torch.randint(0, 2048, (n, 16), device="cuda")


def host_ms(codec, n: int, final: bool, reps: int = 20) -> list[float]:
    out = []
    for _ in range(reps):
        state = codec.new_state(None)
        torch.cuda.synchronize()
        codec.stream.synchronize()
        frames = [frames_on_device(n)]
        event = torch.cuda.Event()
        event.record()
        t = time.perf_counter()
        pending = codec.decode_async([state], frames, final=[final], after=event)
        out.append((time.perf_counter() - t) * 1e3)
        pending.result()
        codec.release(state)
    return out


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/real-1.7b"
    _, codec = load(path, device="cuda", dtype="bfloat16", max_slots=64, codec_sms="auto")
    codec.warmup([1], [1, 2, 5, 10, 25])
    for n, final in ((1, False), (25, False), (20, True)):
        ms = host_ms(codec, n, final)
        print(f"decode_async {n:2d} frames{' final' if final else ''}: host ms median {statistics.median(ms):.3f} "
              f"min {min(ms):.3f} max {max(ms):.3f}", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    host_ms(codec, 25, False, reps=50)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue())


if __name__ == "__main__":
    main()
