"""Tile configurations of the channels-last codec convolutions (voxflow/kernels/causal_conv.py) at the shapes of a
64-stream x 25-frame codec call on the real-size decoder, then the whole codec call with the winners.

    PYTHONPATH=$PWD python benchmarks/scripts/tune_causal_conv.py [BATCH] [FRAMES] [DTYPES, e.g. float32] [SMS]

Prints per (Cin, Cout, k, dtype) the time of each candidate and a TUNED table to paste into causal_conv.py; the
whole codec call is timed with the current table first, then with the winners. SMS: everything on a stream confined
to that many SMs (engine/sm_partition.py), where the served codec runs ("auto": 64 of an H200's 132); the table was
tuned on the whole GPU (sessions 6-15), and tiles that fill 132 SMs in whole waves may not fill 64.
Every convolution of the decoder is tuned (session 41 added the first 1024 -> 1536 one and the four upsampling
blocks' sub-pixel two-tap ones, [2, stride * Cout, Cin]); each shape's current config is timed first ("current"),
and fp16's candidates are mostly for the TMA kernel (which ignores maxnreg; the capped one is for the pointer
kernel the short low-rate sequences take).
"""
import sys

import torch
import triton

from voxflow.kernels import causal_conv

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from event_timing import timed  # noqa: E402

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
FRAMES = int(sys.argv[2]) if len(sys.argv) > 2 else 25
DTYPES = [getattr(torch, d) for d in sys.argv[3].split(",")] if len(sys.argv) > 3 else [torch.float32, torch.bfloat16]
SMS = int(sys.argv[4]) if len(sys.argv) > 4 else None
# (channels, samples a frame) of the four upsampling blocks' residual units, and the output conv
STAGES = ((768, 32), (384, 160), (192, 640), (96, 1920))
# (cin, cout, k, dilation, samples a frame at the input, epilogue) of every convolution of the decoder: its first
# (1024 -> 1536, k=7, at 4 samples a frame), each block's sub-pixel transposed convolution (two taps, stride * Cout
# outputs, at the block's input rate), the residual units' k=7 (SnakeBeta epilogue) and 1x1 (residual) ones, the last
SHAPES = ((1024, 1536, 7, 1, 4, "bias"),
          *((cin, s * cout, 2, 1, rate, "bias") for cin, cout, s, rate in
            ((1536, 768, 8, 4), (768, 384, 5, 32), (384, 192, 4, 160), (192, 96, 3, 640))),
          *(conv for c, rate in STAGES for conv in ((c, c, 7, 3, rate, "snake"), (c, c, 1, 1, rate, "residual"))),
          (96, 1, 7, 1, 1920, "bias"))
CANDIDATES = {
    torch.float32: [(128, 128, 32, 8, 3), (128, 128, 32, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                    (128, 128, 16, 8, 4), (256, 128, 32, 8, 3), (128, 32, 32, 4, 4), (256, 64, 32, 8, 3),
                    (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (128, 128, 32, 8, 5), (256, 128, 32, 8, 4),
                    # two 8-warp blocks an SM: registers capped at 128 (conv_occupancy.py: 40 B of spill a thread)
                    (128, 128, 32, 8, 3, 128), (128, 128, 32, 8, 2, 128), (128, 128, 64, 8, 2, 128)],
    torch.bfloat16: [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                     (256, 128, 64, 8, 3), (128, 128, 32, 8, 4), (128, 32, 64, 4, 4), (256, 64, 64, 8, 3),
                     (128, 128, 64, 8, 3, 128), (128, 128, 64, 8, 2, 128)],
}
# fp16 runs the TMA kernel where a sequence's tiles waste little (causal_conv._sequence_tiles_waste_little): no
# register cap there; deeper pipelines and wider tiles instead
CANDIDATES[torch.float16] = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 32, 8, 4), (128, 256, 64, 8, 3),
                             (128, 256, 32, 8, 4), (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                             (128, 128, 64, 8, 3, 128)]


def tune() -> dict:
    table = {}
    for dtype in DTYPES:
        for c, cout, k, d, per_frame, epi in SHAPES:
            t = per_frame * FRAMES
            x = torch.randn(B, t + (k - 1) * d, c, device="cuda").to(dtype)
            w = causal_conv.pack_weight((torch.randn(cout, c, k, device="cuda") / (c * k) ** 0.5).to(dtype))
            bias = torch.zeros(cout, device="cuda", dtype=dtype)
            kw = {}
            if epi == "snake":
                kw["snake_terms"] = (torch.ones(cout, device="cuda", dtype=dtype),) * 2
            if epi == "residual":
                kw["residual"] = torch.randn(B, t, cout, device="cuda").to(dtype)
            flops = 2 * B * t * c * cout * k
            key = (c, cout, k, dtype)
            results = []
            current = causal_conv.launch_config(c, cout, dtype, k)
            candidates = [("current", current)] + [
                ("", causal_conv._cfg(bt, min(bn, max(16, triton.next_power_of_2(cout))),
                                      min(bk, max(16, triton.next_power_of_2(c))), warps, stages, *cap))
                for bt, bn, bk, warps, stages, *cap in CANDIDATES[dtype] if not (bn > 32 and cout <= 32)]
            # (the first timing of a shape read up to 2.6x high in session 41 (768 -> 1920: 0.734 ms for the config
            # that then took 0.279): one untimed round of the current config first)
            causal_conv.TUNED[key] = current
            try:
                timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, **kw))
            except Exception:                            # timed (and reported) with the candidates below
                pass
            for label, cfg in candidates:
                causal_conv.TUNED[key] = cfg
                try:
                    ms = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, **kw))
                except Exception as e:                       # out of shared memory / registers
                    print(f"  {cfg}: failed ({type(e).__name__})", flush=True)
                    continue
                results.append((ms, cfg))
                print(f"{str(dtype)[6:]:8s} {c:4d}->{cout:<4d} k={k} rows={B * t:8d} {cfg}: {ms:8.3f} ms "
                      f"{flops / ms / 1e9:6.1f} TFLOP/s {label}", flush=True)
            if not results:
                causal_conv.TUNED.pop(key, None)
                print(f"NONE {str(dtype)[6:]} {c}->{cout} k={k}: every candidate failed", flush=True)
                continue
            best = min(results, key=lambda r: r[0])
            table[key] = best[1]
            causal_conv.TUNED[key] = best[1]
            was = f" (current {results[0][0]:.3f} ms)" if results[0][1] is current else ""
            print(f"BEST {str(dtype)[6:]} {c}->{cout} k={k}: {best[0]:.3f} ms {best[1]}{was}", flush=True)
    return table


def codec_call(dtype) -> None:
    from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
    from voxflow.tools.codec_snr import random_real_codec_decoder
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from profile_codec import time_calls
    runner = Qwen3CodecRunner.from_decoder(random_real_codec_decoder("cuda").to(dtype), max_rows=B, stream_sms=SMS)
    states = [runner.new_state(None) for _ in range(B)]
    for n in (1, 10, FRAMES):
        frames = [torch.randint(0, 2048, (n, 16), device="cuda") for _ in range(B)]
        time_calls(runner, states, frames, f"codec {str(dtype)[6:]} B={B} n={n}", warm=2, reps=5)


if __name__ == "__main__":
    for dtype in DTYPES:
        print("with the current table:")
        codec_call(dtype)
    # The timings' stream: SMS SMs of the GPU (context: its green context, kept to the end), or the current one.
    stream = context = None
    if SMS is not None:
        from voxflow.engine.sm_partition import partitioned_stream
        stream, context = partitioned_stream(torch.device("cuda", torch.cuda.current_device()), SMS)
        print(f"on {SMS} SMs of {torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)
    with torch.cuda.stream(stream):     # (None: no change of stream)
        table = tune()
    print("TUNED = {")
    for (c, cout, k, dtype), cfg in table.items():
        print(f"    ({c}, {cout}, {k}, torch.{str(dtype)[6:]}): {cfg},")
    print("}")
    for dtype in DTYPES:
        print("with the winners:")
        codec_call(dtype)
