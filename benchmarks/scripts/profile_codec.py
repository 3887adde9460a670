"""The streaming codec decoder alone on the GPU: time per call and the top kernels, for B streams decoding a chunk of
n frames each (the engine's shapes: 1-frame steps, 25-frame regular chunks), replayed from the runner's CUDA graphs,
in each precision setting asked for.

    python benchmarks/scripts/profile_codec.py MODEL_DIR BATCH SETTING[,SETTING...] [FRAMES[,FRAMES...] [TOP]]
        [--sequence]
    SETTING: fp32 (convolutions and matmuls in TF32, cuDNN's default switch) | fp32-strict (no TF32) | bf16 | fp16,
             each optionally with
             +bench (cudnn.benchmark: cuDNN times its algorithms once per shape before the capture) and/or
             +ncl (the waveform stack in [B, C, T] layout: codec_waveform_cl.py's channels-last path off) and/or
             +smsN (the codec's stream on N SMs, as a server's codec_sms; e.g. +sms64, "auto" on an H200)
    FRAMES: the chunk sizes timed (default 1,25); TOP: kernels listed per chunk size (default 30).
    --sequence: also list one call's kernels in launch order with their times, per chunk size (which layer of the
             waveform stack costs what: the convolution kernels share a name across its levels).
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_step import kernel_summary  # noqa: E402

from voxflow.models.qwen3_tts import codec_waveform_cl  # noqa: E402
from voxflow.models.registry import load_for_engine  # noqa: E402


def time_calls(codec, states, frames, label: str, warm: int = 3, reps: int = 10) -> float:
    """Mean ms of `codec.decode(states, frames)` after `warm` calls (one stream's frames: [n, 16] each); printed
    with the per stream-frame cost."""
    for _ in range(warm):
        codec.decode(states, frames)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        codec.decode(states, frames)
    ms = (time.perf_counter() - t) / reps * 1e3
    per = len(states) * frames[0].shape[0]
    print(f"{label}: {ms:.2f} ms per call, {ms / per * 1e3:.1f} us per stream-frame "
          f"({per * 0.08 / ms * 1e3:.0f} audio-s per s of codec time)", flush=True)
    return ms


PROFILED_CALLS = 3                  # calls recorded by the profiler per chunk size (the tables are per call)


def kernel_sequence(prof, calls: int) -> None:
    """One call's kernels in the order they ran (the first of `calls` profiled calls), with their times."""
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    one = events[:len(events) // calls]
    print(f"  one call's {len(one)} kernels in launch order (us, name):")
    for i, e in enumerate(one):
        print(f"    {i:4d} {e.device_time:8.1f}  {e.name[:100]}")


def run(model: str, batch: int, setting: str, chunks: tuple = (1, 25), top: int = 30,
        sequence: bool = False) -> None:
    base, *extra = setting.split("+")
    torch.backends.cudnn.allow_tf32 = base != "fp32-strict"
    torch.backends.cudnn.benchmark = "bench" in extra
    codec_waveform_cl.ENABLED = "ncl" not in extra
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(base, "float32")
    sms = [int(e[3:]) for e in extra if e.startswith("sms")]
    _, codec = load_for_engine(model, device="cuda", dtype="bfloat16", max_slots=batch, codec_dtype=dtype,
                               **({"codec_sms": sms[0]} if sms else {}))
    t = time.perf_counter()
    codec.warmup([batch], list(chunks))
    print(f"{setting}: graph capture {time.perf_counter() - t:.1f} s", flush=True)
    states = [codec.new_state(None) for _ in range(batch)]
    for n in chunks:
        frames = [torch.randint(0, 2048, (n, 16), device="cuda") for _ in range(batch)]
        time_calls(codec, states, frames, f"{setting} B={batch} n={n}")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED_CALLS):
                codec.decode(states, frames)
        kernel_summary(prof, PROFILED_CALLS, top=top)
        if sequence:
            kernel_sequence(prof, PROFILED_CALLS)
    for s in states:
        codec.release(s)
    del codec
    torch.cuda.empty_cache()


def main() -> None:
    sequence = "--sequence" in sys.argv
    argv = [a for a in sys.argv if a != "--sequence"]
    chunks = tuple(int(n) for n in argv[4].split(",")) if len(argv) > 4 else (1, 25)
    top = int(argv[5]) if len(argv) > 5 else 30
    for setting in argv[3].split(","):
        run(argv[1], int(argv[2]), setting, chunks, top, sequence)


if __name__ == "__main__":
    main()
