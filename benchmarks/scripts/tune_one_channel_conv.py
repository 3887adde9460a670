"""The codec's last convolution (96 -> 1 channel, k=7) at a serving call's shape: the one-channel kernel's launches
(voxflow/kernels/one_channel_conv_cl.py) against the implicit-GEMM kernel it replaces (causal_conv.py); the whole
codec call with it: ab_codec_call.py.

    PYTHONPATH=$PWD python benchmarks/scripts/tune_one_channel_conv.py [BATCH] [FRAMES] [SMS]

BATCH streams x FRAMES frames (1920 samples a frame) in fp16, the codec's GPU dtype; SMS: on a stream confined to
that many SMs (engine/sm_partition.py), as the served codec runs (64 of 132 by default). Prints each launch's time,
its effective bandwidth (the input read once), its largest difference from the implicit GEMM's output, and the best.
"""
import sys

import torch

from voxflow.kernels import causal_conv, one_channel_conv_cl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from event_timing import timed  # noqa: E402

B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
FRAMES = int(sys.argv[2]) if len(sys.argv) > 2 else 25
SMS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
CIN, K = 96, 7
LAUNCHES = [(bt, w) for bt in (32, 64, 128, 256, 512) for w in (2, 4, 8) if 4 <= bt // w <= 64]


def tune() -> None:
    t = FRAMES * 1920
    x = torch.randn(B, t + K - 1, CIN, device="cuda").half()
    w = causal_conv.pack_weight((torch.randn(1, CIN, K, device="cuda") / (CIN * K) ** 0.5).half())
    bias = torch.zeros(1, device="cuda", dtype=torch.half)
    gbytes = x.numel() * x.element_size() / 1e9
    want = causal_conv.conv1d_channels_last(x, w, bias)
    timed(lambda: causal_conv.conv1d_channels_last(x, w, bias))             # (an untimed round first)
    ms = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias), reps=20)
    print(f"implicit GEMM (current): {ms * 1e3:7.1f} us  {gbytes / ms * 1e3:7.1f} GB/s", flush=True)
    results = []
    for launch in LAUNCHES:
        try:
            got = one_channel_conv_cl.conv1d_to_one_channel(x, w, bias, launch=launch)
            ms = timed(lambda: one_channel_conv_cl.conv1d_to_one_channel(x, w, bias, launch=launch), reps=20)
        except Exception as e:                                              # out of registers / shared memory
            print(f"  {launch}: failed ({type(e).__name__}: {e})", flush=True)
            continue
        diff = (got.float() - want.float()).abs().max().item()
        results.append((ms, launch))
        print(f"one-channel {launch}: {ms * 1e3:7.1f} us  {gbytes / ms * 1e3:7.1f} GB/s  max diff {diff:.2e}",
              flush=True)
    best = min(results)
    print(f"BEST {best[1]}: {best[0] * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    from voxflow.engine.sm_partition import partitioned_stream
    stream, context = partitioned_stream(torch.device("cuda", torch.cuda.current_device()), SMS)
    print(f"on {SMS} SMs of {torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)
    with torch.cuda.stream(stream):
        tune()
