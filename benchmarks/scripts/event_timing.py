"""Milliseconds a call of a GPU function, from CUDA events around `reps` back-to-back eager calls after one warm-up
call (compilation, autotuning and allocation kept out). Shared by the kernel timing scripts."""
import torch


def timed(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps
