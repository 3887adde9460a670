"""What the codec's channels-last convolutions spend outside their GEMM: each residual-unit convolution of the
real-size decoder at the serving codec call (16 streams x 25 frames), timed bare, + bias, and with its served
epilogue (k=7: + bias + SnakeBeta; k=1: + bias + residual), next to the stand-alone SnakeBeta pass over the same
activation. If the SnakeBeta epilogue (libdevice sinf and torch's rounding points, bit-equal to torch) is a large
share, the codec is bound by it rather than by the tensor cores. Then the served k=7 convolution with the
epilogue's SnakeBeta on the hardware's sin.approx (causal_conv.FAST_EPILOGUE_SIN) and its largest difference from
the libdevice-sinf output; for the fp16 96- and 192-channel shapes also served with the TMA kernel's columns in
two accumulators (causal_conv.CONV_SPLIT_N) and its largest difference from the one-tile output. Last, the
96-channel residual unit's two convolutions (k=7 + SnakeBeta, 1x1 + bias + residual) as the two kernels and as
residual_unit.py's one kernel, and their largest difference.

    PYTHONPATH=$PWD python benchmarks/scripts/conv_epilogue_cost.py [BATCH] [FRAMES] [DTYPES] [--only C]
"""
import sys

import torch

from voxflow.kernels import causal_conv

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from event_timing import timed  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
B = int(args[0]) if args else 16
FRAMES = int(args[1]) if len(args) > 1 else 25
DTYPES = [getattr(torch, d) for d in args[2].split(",")] if len(args) > 2 else [torch.float32, torch.bfloat16]
ONLY = int(sys.argv[sys.argv.index("--only") + 1]) if "--only" in sys.argv else None
STAGES = ((768, 32), (384, 160), (192, 640), (96, 1920))      # (channels, samples a frame), as tune_causal_conv.py




def main() -> None:
    torch.backends.cudnn.allow_tf32 = True                # the served fp32 setting: TF32 products
    print(f"{torch.cuda.get_device_name()}, {B} streams x {FRAMES} frames; ms a call")
    print(f"{'dtype':9} {'C':>4} {'k':>2} {'rows':>8} | {'bare':>7} {'+bias':>7} {'served':>7} {'epi %':>6} | "
          f"{'snake pass':>10} | {'TFLOP/s bare':>12} | {'fast sin':>8} {'max diff':>9}")
    for dtype in DTYPES:
        for c, per_frame in STAGES:
            if ONLY and c != ONLY:
                continue
            t = per_frame * FRAMES
            for k, d in ((7, 3), (1, 1)):
                x = torch.randn(B, t + (k - 1) * d, c, device="cuda").to(dtype)
                w = causal_conv.pack_weight((torch.randn(c, c, k, device="cuda") / (c * k) ** 0.5).to(dtype))
                bias = (torch.randn(c, device="cuda") * 0.1).to(dtype)
                a = (torch.rand(c, device="cuda") + 0.5).to(dtype)
                inv = (torch.rand(c, device="cuda") + 0.5).to(dtype)
                res = torch.randn(B, t, c, device="cuda").to(dtype)
                bare = timed(lambda: causal_conv.conv1d_channels_last(x, w, None, d))
                biased = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d))
                if k == 7:
                    served = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, snake_terms=(a, inv)))
                else:
                    served = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, residual=res))
                snake = timed(lambda: causal_conv.snake_channels_last(res, a, inv))
                fast = ""
                if k == 7:
                    # (the served default is restored after: session 46 found this block leaving libdevice's sinf
                    # on for every later shape's "served" column once FAST_EPILOGUE_SIN had become the default)
                    default = causal_conv.FAST_EPILOGUE_SIN
                    causal_conv.FAST_EPILOGUE_SIN = False
                    want = causal_conv.conv1d_channels_last(x, w, bias, d, snake_terms=(a, inv))
                    causal_conv.FAST_EPILOGUE_SIN = True
                    got = causal_conv.conv1d_channels_last(x, w, bias, d, snake_terms=(a, inv))
                    fast_ms = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, snake_terms=(a, inv)))
                    causal_conv.FAST_EPILOGUE_SIN = default
                    fast = f"{fast_ms:8.3f} {(got.float() - want.float()).abs().max().item():9.2e}"
                split = ""
                if causal_conv.SPLIT_N_TUNED.get((c, c, k, dtype)) is not None and x.is_cuda:
                    # the TMA kernel's two accumulators (VOXFLOW_CONV_SPLIT_N) against its one masked tile
                    kw = dict(snake_terms=(a, inv)) if k == 7 else dict(residual=res)
                    one = causal_conv.conv1d_channels_last(x, w, bias, d, **kw)
                    causal_conv.CONV_SPLIT_N = True
                    two = causal_conv.conv1d_channels_last(x, w, bias, d, **kw)
                    split_ms = timed(lambda: causal_conv.conv1d_channels_last(x, w, bias, d, **kw))
                    causal_conv.CONV_SPLIT_N = False
                    split = f" | split-N {split_ms:7.3f} {(two.float() - one.float()).abs().max().item():9.2e}"
                flops = 2 * B * t * c * c * k
                print(f"{str(dtype)[6:]:9} {c:4d} {k:2d} {B * t:8d} | {bare:7.3f} {biased:7.3f} {served:7.3f} "
                      f"{(served - bare) / served * 100:5.1f}% | {snake:10.3f} | {flops / bare / 1e9:12.1f} | {fast}"
                      f"{split}",
                      flush=True)
                x = w = res = got = want = None
            torch.cuda.empty_cache()

    from voxflow.kernels.residual_unit import residual_unit_channels_last
    print(f"{'dtype':9} residual unit, 96 channels, dilation 3: two kernels / fused (ms), largest difference")
    for dtype in DTYPES:
        c, t, d = 96, 1920 * FRAMES, 3
        x = torch.randn(B, t + 6 * d, c, device="cuda").to(dtype)
        w7 = causal_conv.pack_weight((torch.randn(c, c, 7, device="cuda") / (7 * c) ** 0.5).to(dtype))
        w1 = causal_conv.pack_weight((torch.randn(c, c, 1, device="cuda") / c ** 0.5).to(dtype))
        b7, b1 = (torch.randn(c, device="cuda") * 0.1).to(dtype), (torch.randn(c, device="cuda") * 0.1).to(dtype)
        a, inv = (torch.rand(c, device="cuda") + 0.5).to(dtype), (torch.rand(c, device="cuda") + 0.5).to(dtype)
        res = torch.randn(B, t, c, device="cuda").to(dtype)

        def two():
            h = causal_conv.conv1d_channels_last(x, w7, b7, d, snake_terms=(a, inv))
            return causal_conv.conv1d_channels_last(h, w1, b1, 1, residual=res)

        def fused():
            return residual_unit_channels_last(x, w7, b7, d, (a, inv), w1, b1, res)

        diff = (two().float() - fused().float()).abs().max().item()
        print(f"{str(dtype)[6:]:9} {timed(two):.3f} / {timed(fused):.3f}   {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
