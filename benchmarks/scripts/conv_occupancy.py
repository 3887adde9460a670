"""Blocks an SM of the channels-last convolution's launch configurations on an H200, without a GPU: each config
compiled for sm_90 (Triton's compiler and ptxas, as voxflow.kernels.compile_check does), its registers a thread
and shared memory read from the cubin and the compiled metadata, and the resident blocks an SM they allow
(65,536 registers, 227 KB of shared memory, 64 warps). Session 14's Nsight Compute run found the served 96-channel
convolutions at one 8-warp block an SM (194 registers, 164 KB): this lists the configs that fit two or more, the
candidates for tune_causal_conv.py, including 128 x 128 tiles with registers capped at 128 (ptxas' maxnreg).

    python benchmarks/scripts/conv_occupancy.py [CHANNELS,...] [DTYPES]
"""
import itertools
import re
import sys

import torch
import triton
from triton.compiler import ASTSource

from voxflow.kernels import causal_conv
from voxflow.kernels.compile_check import HOPPER, conv_channels_last_case, resource_usage

CHANNELS = [int(c) for c in sys.argv[1].split(",")] if len(sys.argv) > 1 else [96, 192]
DTYPES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["fp32", "bf16"]
REGS, SMEM, WARPS = 65536, 227 * 1024, 64


def compiled(kernel, types, consts, options):
    import inspect
    options = dict(options)
    aligned = options.pop("aligned", ())
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: ("constexpr" if p in consts else types.get(p, "i32")) for p in params}
    source = ASTSource(fn=kernel, signature=signature, constexprs={(params.index(k),): v for k, v in consts.items()},
                       attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(source, target=HOPPER, options=options)


def main() -> None:
    print(f"{'dtype':5} {'C':>4} {'k':>2} {'BLOCK_T,N,K':>12} {'warps':>5} {'stages':>6} | {'regs':>4} {'smem KB':>7} "
          f"{'blocks/SM':>9} (limited by) {'spill B':>7}")
    for dt, c, k in itertools.product(DTYPES, CHANNELS, (7, 1)):
        dtype = torch.float32 if dt == "fp32" else torch.bfloat16
        block_k = 32 if dt == "fp32" else 64
        tuned = causal_conv.TUNED.get((c, c, k, dtype))
        grid = [(bt, bn, warps, stages, None) for bt, bn, warps, stages in
                itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4))]
        grid += [(128, 128, 8, stages, 128) for stages in (2, 3)]          # registers capped: two blocks an SM?
        for bt, bn, warps, stages, cap in grid:
            cfg = causal_conv._cfg(bt, bn, block_k, warps, stages, cap)
            aligned = ("x_ptr", "w_ptr", "bias_ptr", "a_ptr", "inv_ptr", "res_ptr", "out_ptr", "CIN", "COUT", "x_sb",
                       "x_st", "res_sb", "res_st", "out_sb", "out_st")
            epilogue = "SNAKE" if k == 7 else "RESIDUAL"
            try:
                kernel = compiled(*conv_channels_last_case(dt, c, k, epilogue, cfg, aligned))
            except Exception as e:  # noqa: BLE001 - a config the compiler rejects (e.g. too much shared memory)
                print(f"{dt:5} {c:4d} {k:2d} {f'{bt},{bn},{block_k}':>12} {warps:5d} {stages:6d} | "
                      f"{type(e).__name__}")
                continue
            usage = resource_usage(kernel.asm["cubin"])
            regs = int(re.search(r"REG:(\d+)", usage).group(1))
            stack = int(re.search(r"STACK:(\d+)", usage).group(1))
            smem = kernel.metadata.shared
            limits = {"registers": REGS // (regs * 32 * warps), "shared": SMEM // max(smem, 1),
                      "warps": WARPS // warps}
            blocks = min(limits.values())
            mark = " <- tuned" if tuned == cfg else f" (maxnreg {cap})" if cap else ""
            print(f"{dt:5} {c:4d} {k:2d} {f'{bt},{bn},{block_k}':>12} {warps:5d} {stages:6d} | {regs:4d} "
                  f"{smem / 1024:7.1f} {blocks:9d} ({min(limits, key=limits.get)}) {stack:7d}{mark}", flush=True)


if __name__ == "__main__":
    main()
