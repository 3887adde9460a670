"""Compile every Triton kernel of voxflow for an NVIDIA Hopper GPU (sm_90, the H200) on a machine without one.

Triton's interpreter (the CPU tests) checks what a kernel computes, not that it compiles: a construct the GPU
front end or ptxas rejects only shows on the device, where time is scarce. `compile_all()` runs Triton's real
compiler (front end, LLVM, ptxas as bundled with the triton wheel) for a GPU target with representative
signatures and constexpr configurations, no GPU needed. Used by tests/test_kernels_compile.py and as

    python -m voxflow.kernels.compile_check      (also prints registers / spill stack bytes per thread)
"""
from __future__ import annotations

import inspect

import torch

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)
_DTYPE_OF = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _ptr(t: str) -> str:
    return "*" + t


def compile_kernel(fn, types: dict, constexprs: dict, target: GPUTarget = HOPPER, aligned: tuple = (),
                   **options) -> dict:
    """Compile `fn` (an @triton.jit function) for `target`; arguments not named in `types` are i32 scalars.
    `aligned`: arguments the JIT would specialize as divisible by 16 (16-byte-aligned pointers, integers that are
    multiples of 16), which decides whether loads vectorize; without it the code is the unaligned fallback."""
    parameters = inspect.signature(fn.fn).parameters
    params = list(parameters)
    # constexprs with defaults the case leaves out take them, as the JIT would
    constexprs = {**{p: v.default for p, v in parameters.items() if v.default is not inspect.Parameter.empty},
                  **constexprs}
    signature = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(params.index(k),): v for k, v in constexprs.items()},
                       attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(source, target=target, options=options).asm


def cases() -> list[tuple[str, object, dict, dict, dict]]:
    """(name, kernel, argument types, constexprs, launch options) for each kernel and its main configurations."""
    from voxflow.kernels import dense_decode_attention as dense
    from voxflow.kernels import dense_decode_norm_rope as dense_nr
    from voxflow.kernels import paged_decode_attention as paged
    from voxflow.kernels.pdl import EXIT
    from voxflow.kernels import qk_norm_rope, rms_norm, select_tokens, silu_mul, skinny_linear, snake_beta
    from voxflow.kernels import causal_conv, frame_input, kv_window, row_copy, rvq_lookup, slot_write_back
    from voxflow.kernels import context_exchange, rope_table, uniform_noise, window_attention
    bf, f32, i64, h = _ptr("bf16"), _ptr("fp32"), _ptr("i64"), _ptr("fp16")
    out = []
    # (the PDL variant with the embedding-row copy, as the code predictor's draws launch it)
    # (and fp16 logits, whose radix select decides 20 key bits: select_tokens.key_bits)
    # (and the code predictor's draws with the row scale of a head whose norm was folded in: row_scale=)
    for top_p, talker, pdl, dt, scale in ((False, False, False, "bf16", False), (True, False, False, "bf16", False),
                                          (False, True, False, "bf16", False), (False, False, True, "bf16", False),
                                          (False, False, False, "fp16", False), (False, False, True, "bf16", True),
                                          (True, False, True, "bf16", True), (False, False, True, "fp32", True)):
        out.append((f"select_tokens {dt} top_p={top_p} talker={talker}" + (" pdl" if pdl else "")
                    + (" row_scale" if scale else ""),
                    select_tokens._select_tokens_kernel,
                    dict(logits_ptr=_ptr(dt), do_sample_ptr=_ptr("u8"), temperature_ptr=f32, top_k_ptr=i64,
                         top_p_ptr=_ptr("fp64"), keys_ptr=i64, frame_ptr=i64, out_ptr=i64, seen_ptr=_ptr("u8"),
                         seen_rows_ptr=i64, penalty_ptr=f32, num_gen_ptr=i64, min_new_ptr=i64,
                         suppress_ptr=_ptr("u8"), emb_ptr=bf, emb_out_ptr=bf, emb2_ptr=bf, emb2_out_ptr=bf,
                         scale_ptr=_ptr(dt), inv_scale_width="fp32", scale_eps="fp32"),
                    dict(USE_TOP_P=top_p, PRECISE=True, TALKER=talker, RADIX_BITS=select_tokens.RADIX_BITS,
                         KEY_BITS=select_tokens.key_bits(_DTYPE_OF[dt], talker, select_tokens.RADIX_BITS),
                         BLOCK=4096, USE_PDL=pdl, EMBED=pdl, BLOCK_E=2048, EMBED2=pdl, BLOCK_E2=1024,
                         HALF_EXIT=True, SEEN_ROWS=talker, ROW_SCALE=scale, BLOCK_S=1024),
                    dict(num_warps=8, enable_fp_fusion=False, launch_pdl=pdl)))
    for dt in ("fp32", "bf16"):
        p = _ptr(dt)
        for has_bias in (False, True):
            out.append((f"snake_beta {dt} bias={has_bias}", snake_beta._snake_beta_kernel,
                        dict(x_ptr=p, a_ptr=p, inv_ptr=p, bias_ptr=p, out_ptr=p),
                        dict(HAS_BIAS=has_bias, PRECISE=True, BLOCK=1024), dict(num_warps=4, enable_fp_fusion=False)))
        out.append((f"bias_residual {dt}", snake_beta._bias_residual_kernel,
                    dict(h_ptr=p, bias_ptr=p, x_ptr=p, out_ptr=p), dict(BLOCK=1024),
                    dict(num_warps=4, enable_fp_fusion=False)))
    for dt in ("fp32", "bf16", "fp16"):
        p = _ptr(dt)
        dtype = _DTYPE_OF[dt]
        out.append((f"snake_channels_last {dt}", causal_conv._snake_cl_kernel,
                    dict(x_ptr=p, a_ptr=p, inv_ptr=p, out_ptr=p), dict(PRECISE=True, BLOCK=1024),
                    dict(num_warps=4, enable_fp_fusion=False)))
        for has_tail in (False, True):
            for activate in (False, True) if has_tail else (False,):
                out.append((f"overlap_add_channels_last {dt} tail={has_tail}" + (" ACTIVATE" if activate else ""),
                            causal_conv._overlap_add_kernel,
                            dict(g_ptr=p, bias_ptr=p, tail_ptr=p, y_ptr=p, a_ptr=p, inv_ptr=p, act_ptr=p),
                            dict(S=3, K=6, HAS_TAIL=has_tail, ACTIVATE=activate, BLOCK_R=8, BLOCK_Q=512,
                                 PRECISE=causal_conv.epilogue_sin_mode(True, dtype, "ieee")),
                            dict(num_warps=8, enable_fp_fusion=False)))
        # every tuned configuration, specialised as the JIT sees the decoder's calls (16-byte-aligned pointers,
        # channel counts and strides multiples of 16), plus the one-channel output conv unaligned
        for (cin, cout, k, tdt), cfg in causal_conv.TUNED.items():
            if tdt != dtype:
                continue
            epilogue = "SNAKE" if k > 1 and cout > 1 else "RESIDUAL" if k == 1 else None
            aligned = ("x_ptr", "w_ptr", "bias_ptr", "a_ptr", "inv_ptr", "res_ptr", "a2_ptr", "inv2_ptr", "raw_ptr",
                       "out_ptr", "CIN", "x_sb", "x_st", "res_sb", "res_st", "raw_sb", "raw_st", "out_sb", "out_st"
                       ) + (("COUT",) if cout % 16 == 0 else ())
            out.append((f"conv_channels_last {dt} {cin}->{cout} k={k} {epilogue}",
                        *conv_channels_last_case(dt, cin, k, epilogue, cfg, aligned if cout > 1 else ())))
            if dt == "fp16":                # the TMA variant (VOXFLOW_CONV_TMA) in the codec's GPU dtype
                out.append((f"conv_channels_last_tma {dt} {cin}->{cout} k={k} {epilogue}",
                            *conv_tma_case(dt, k, epilogue, cfg)))
                if k == 1 and cin in (96, 768):     # the units' 1x1 convolution with the next SnakeBeta
                    for tail in ("ACTIVATE", "ACTIVATE RAW_OUT"):   # (codec_waveform_cl.ACT_IN_EPILOGUE)
                        out.append((f"conv_channels_last_tma {dt} {cin}->{cout} k={k} {epilogue} {tail}",
                                    *conv_tma_case(dt, k, f"{epilogue} {tail}", cfg)))
                        out.append((f"conv_channels_last {dt} {cin}->{cout} k={k} {epilogue} {tail}",
                                    *conv_channels_last_case(dt, cin, k, f"{epilogue} {tail}", cfg, aligned)))
            # libdevice's sinf in the epilogue (FAST_EPILOGUE_SIN off), and the register cap (fp32 / bf16)
            if cin == cout == 96 and k == 7 and dt != "fp16":
                kernel, types, consts, options = conv_channels_last_case(dt, cin, k, epilogue, cfg, aligned)
                out.append((f"conv_channels_last {dt} {cin}->{cout} k={k} {epilogue} libdevice sin", kernel, types,
                            {**consts, "PRECISE": 1}, options))
                capped = causal_conv._cfg(128, 128, cfg["BLOCK_K"], 8, 3, 128)  # tune_causal_conv.py's register cap
                out.append((f"conv_channels_last {dt} {cin}->{cout} k={k} {epilogue} maxnreg 128",
                            *conv_channels_last_case(dt, cin, k, epilogue, capped, aligned)))
    for write_all in (1, 0):                                                     # the codec attention's window
        out.append((f"kv_window fp16 head_dim 64 write_all={write_all}", kv_window._kv_window_kernel,
                    dict(kc_ptr=h, kn_ptr=h, ka_ptr=h, kk_ptr=h, vc_ptr=h, vn_ptr=h, va_ptr=h, vk_ptr=h),
                    dict(BLOCK_S=32, BLOCK_D=64, WRITE_ALL=write_all), dict(num_warps=4)))
    out.append(("context_exchange fp16", context_exchange._context_exchange_kernel,   # the codec's conv contexts
                dict(buf_ptr=h, old_ptr=h, new_ptr=h), dict(BLOCK_R=16, BLOCK_C=128), dict(num_warps=4)))
    out.append(("rope_table fp16 head_dim 64", rope_table._rope_table_kernel,    # the codec's RoPE tables
                dict(start_ptr=i64, inv_freq_ptr=h, cos_ptr=h, sin_ptr=h, next_ptr=i64), dict(BLOCK=32),
                dict(num_warps=1)))
    for dt, block_n, warps in (("fp16", 32, 4), ("fp32", 16, 8)):       # the codec's attention (fp32: IEEE dots)
        out.append((f"window_attention {dt} head_dim 64", window_attention._window_attention_kernel,
                    dict(q_ptr=_ptr(dt), kc_ptr=_ptr(dt), vc_ptr=_ptr(dt), kn_ptr=_ptr(dt), vn_ptr=_ptr(dt),
                         start_ptr=i64, out_ptr=_ptr(dt), scale="fp32"),
                    dict(BLOCK_D=64, BLOCK_T=16, BLOCK_N=block_n, IEEE=int(dt == "fp32")), dict(num_warps=warps)))
    out.append(("rvq_lookup fp16 dim 256", rvq_lookup._rvq_lookup_kernel,        # the codec's 15 + 1 codebooks
                dict(codes_ptr=i64, table_ptr=_ptr("fp16"), out_ptr=_ptr("fp16")), dict(BLOCK_D=256),
                dict(num_warps=2, enable_fp_fusion=False)))
    # the sub-pixel transposed convolution (codec_waveform_cl.SUBPIXEL) with the next unit's SnakeBeta and its input
    # stored twice (ACT_IN_EPILOGUE 2): the first block's two-tap 1536 -> 8 x 768 convolution, by launch_config's rule
    subpixel = causal_conv.launch_config(1536, 8 * 768, torch.float16, 2)
    out.append(("conv_channels_last_tma fp16 1536->6144 k=2 sub-pixel ACTIVATE RAW_OUT",
                *conv_tma_case("fp16", 2, "ACTIVATE RAW_OUT", subpixel)))
    # ... and with tiles across sequences (its 100 rows a sequence in a 25-frame call: causal_conv.CONV_TMA_FLAT)
    out.append(("conv_channels_last_tma fp16 1536->6144 k=2 sub-pixel ACTIVATE RAW_OUT flat",
                *conv_tma_case("fp16", 2, "ACTIVATE RAW_OUT", subpixel, flat=True)))
    # the last convolution on its own kernel (codec_waveform_cl.ONE_CHANNEL_KERNEL): 96 -> 1 channel, k=7
    from voxflow.kernels import one_channel_conv_cl
    block_t, warps = one_channel_conv_cl.LAUNCH
    out.append(("one_channel_conv fp16 96->1 k=7", one_channel_conv_cl._one_channel_conv_kernel,
                dict(x_ptr=_ptr("fp16"), w_ptr=_ptr("fp16"), bias_ptr=_ptr("fp16"), out_ptr=_ptr("fp16")),
                dict(CIN=96, KSIZE=7, DILATION=1, HAS_BIAS=True, EVEN_C=True, BLOCK_T=block_t,
                     BLOCK_C=one_channel_conv_cl.channel_block(96)[0]), dict(num_warps=warps, enable_fp_fusion=True)))
    # the ConvNeXt blocks' depthwise convolution + LayerNorm over rows (codec_upsample_cl.py): 1024 channels, k=7
    from voxflow.kernels import dwconv_layer_norm
    out.append(("dwconv_layer_norm fp16 1024 k=7", dwconv_layer_norm._dwconv_layer_norm_kernel,
                {p: _ptr("fp16") for p in ("x_ptr", "ctx_ptr", "w_ptr", "b_ptr", "nw_ptr", "nb_ptr", "out_ptr",
                                           "new_ctx_ptr")} | {"eps": "fp32"},
                dict(K=7, BLOCK_T=dwconv_layer_norm.BLOCK_T, BLOCK_C=1024),
                dict(num_warps=dwconv_layer_norm.NUM_WARPS, enable_fp_fusion=False)))
    # the two-accumulator form (VOXFLOW_CONV_SPLIT_N) with each shape's served epilogues: k=7 + SnakeBeta; 1x1 +
    # residual (and the next SnakeBeta with the raw value kept, ACT_IN_EPILOGUE 2); the sub-pixel k=2 the latter
    for (cin, cout, k, _), split in causal_conv.SPLIT_N_TUNED.items():
        for epilogue in {7: ["SNAKE"], 1: ["RESIDUAL", "RESIDUAL ACTIVATE RAW_OUT"], 2: ["ACTIVATE RAW_OUT"]}[k]:
            out.append((f"conv_channels_last_tma fp16 {cin}->{cout} k={k} {epilogue} split-N",
                        *conv_tma_case("fp16", k, epilogue, split)))
    for dt in ("fp16", "i64"):                  # the codec pool's rows: fp16 state (aligned widths), int64 counters
        for gather in (True, False):
            out.append((f"copy_rows {dt} gather={gather}", row_copy._copy_rows_kernel,
                        dict(src_ptr=_ptr(dt), dst_ptr=_ptr(dt), rows_ptr=i64),
                        dict(GATHER=gather, BLOCK=row_copy._BLOCK if dt == "fp16" else 1),
                        dict(num_warps=8 if dt == "fp16" else 1,
                             aligned=("src_ptr", "dst_ptr", "N", "src_stride", "dst_stride") if dt == "fp16" else ())))
    for dt in ("bf16", "u8"):                   # a packed prefill's K/V rows into their pages (bf16 / fp8 pools):
        out.append((f"copy_rows {dt} kv pages", row_copy._copy_rows_kernel,   # 8 heads x 128, as _launch takes them
                    dict(src_ptr=_ptr(dt), dst_ptr=_ptr(dt), rows_ptr=i64), dict(GATHER=False, BLOCK=1024),
                    dict(num_warps=1, aligned=("src_ptr", "dst_ptr", "N", "src_stride", "dst_stride"))))
    for dt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):       # residual_unit.py at 96 channels
        out.append((f"residual_unit {dt} 96", *residual_unit_case(dt, dtype)))
    for channels in (96, 192):          # residual_unit_tma.py, as the stack's units launch it (ACT_IN_EPILOGUE 2)
        for epilogue in ("ACTIVATE RAW_OUT", "ACTIVATE"):
            out.append((f"residual_unit_tma fp16 {channels} {epilogue}", *residual_unit_tma_case(channels, epilogue)))
    skinny_types = dict(x_ptr=bf, w_ptr=bf, nw_ptr=bf, bias_ptr=bf, res_ptr=bf, out_ptr=bf, ws_ptr=f32,
                        k_float="fp32", eps="fp32")
    for m in (1, 4, 8, 64):
        for fused in (dict(NORM=True), dict(GATED=True, HAS_RES=True), dict(HAS_BIAS=True, HAS_RES=True)):
            cfg = skinny_linear.launch_config(m, 1024, 3072, None)
            # (pdl, preload): PDL alone, and with pdl.py's weight preload (the first W tile before the wait)
            for pdl, preload in (((False, False), (True, False), (True, True)) if m == 1 else ((False, False),)):
                consts = dict(NORM=False, GATED=False, HAS_BIAS=False, HAS_RES=False, PRECISE_EXP=True,
                              DOT_IN_FP32=False, USE_PDL=pdl, PRELOAD=preload)
                consts.update(fused)
                consts.update({k: v for k, v in cfg.items() if k.isupper()})
                out.append((f"skinny_linear m={m} {'+'.join(k for k in fused)}" + (" pdl" if pdl else "")
                            + (" preload" if preload else ""),
                            skinny_linear._skinny_linear_kernel, skinny_types, consts,
                            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl)))
    # The split-K fixup (the last program of a column block sums the partials), without and with PDL: down_proj at
    # 64 rows.
    cfg = dict(skinny_linear.launch_config(64, 1024, 3072, None), SPLIT_K=2)
    for pdl in (False, True):
        consts = dict(NORM=False, GATED=True, HAS_BIAS=False, HAS_RES=True, PRECISE_EXP=True, DOT_IN_FP32=False,
                      USE_PDL=pdl, PRELOAD=False, FIXUP=True, **{k: v for k, v in cfg.items() if k.isupper()})
        out.append(("skinny_linear m=64 GATED+HAS_RES split-k fixup" + (" pdl" if pdl else ""),
                    skinny_linear._skinny_linear_kernel, dict(skinny_types, count_ptr="*i32"), consts,
                    dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl)))
    # The code predictor's fused layer kernels as the JIT specializes them at batch 1 (M == 1 a constant, aligned
    # pointers and strides), and at 4 rows.
    # The talker's one-row layers (qwen3_layer.ONE_ROW_NORM_LINEAR) at the 1.7B talker's K = 2048.
    for name, m, n, k, swiglu in (("q|k|v", 1, 4096, 1024, False), ("gate|up", 1, 3072, 1024, True),
                                  ("lm_head", 1, 2048, 1024, False), ("q|k|v m=4", 4, 4096, 1024, False),
                                  ("gate|up m=4", 4, 3072, 1024, True), ("talker q|k|v", 1, 4096, 2048, False),
                                  ("talker gate|up", 1, 6144, 2048, True)):
        out.append((f"norm_linear {name}", *norm_linear_case(m, n, k, swiglu)))
    out.append(("norm_linear down+residual (no norm)", *norm_linear_case(1, 1024, 3072, False, norm=False,
                                                                         residual=True)))
    # With programmatic dependent launch (pdl.py: griddepcontrol wait, then launch_dependents).
    # And with the weight preload (pdl.py), at the code predictor's and the talker's one-row widths.
    for name, n, k, swiglu in (("q|k|v", 4096, 1024, False), ("gate|up", 3072, 1024, True),
                               ("talker q|k|v", 4096, 2048, False), ("talker gate|up", 6144, 2048, True)):
        for preload in (False, True):
            out.append((f"norm_linear {name} pdl" + (" preload" if preload else ""),
                        *norm_linear_case(1, n, k, swiglu, pdl=True, preload=preload)))
    # And with the exit trigger (pdl.EXIT: the wait alone), as pdl.trigger_mode gives the code predictor's kernels.
    out.append(("norm_linear q|k|v pdl exit", *norm_linear_case(1, 4096, 1024, False, pdl=EXIT)))
    out.append(("attention_o_proj block_h=4 block_n=32 m=1 pdl exit",
                *attention_o_proj_case(1, dict(BLOCK_H=4, BLOCK_N=32), pdl=EXIT)))
    for block_h, block_n, m in ((4, 32, 1), (2, 64, 1), (1, 32, 1), (4, 64, 1), (16, 8, 1), (4, 32, 4)):
        out.append((f"attention_o_proj block_h={block_h} block_n={block_n} m={m}",
                    *attention_o_proj_case(m, dict(BLOCK_H=block_h, BLOCK_N=block_n))))
    out.append(("attention_o_proj block_h=4 block_n=32 m=1 pdl",
                *attention_o_proj_case(1, dict(BLOCK_H=4, BLOCK_N=32), pdl=True)))
    out.append(("attention_o_proj block_h=4 block_n=32 joint",
                *attention_o_proj_case(2, dict(BLOCK_H=4, BLOCK_N=32), joint=True)))
    out.append(("attention_o_proj block_h=4 block_n=32 joint pdl",
                *attention_o_proj_case(2, dict(BLOCK_H=4, BLOCK_N=32), pdl=True, joint=True)))
    out.append(("attention_o_proj block_h=4 block_n=32 joint pdl exit",
                *attention_o_proj_case(2, dict(BLOCK_H=4, BLOCK_N=32), pdl=EXIT, joint=True)))
    for pdl, folded, new in ((False, False, 1), (True, False, 1), (False, True, 1), (True, True, 2)):
        out.append(("dense_decode_norm_rope" + (" pdl" if pdl else "") + (" folded" if folded else "")
                    + (f" new={new}" if new > 1 else ""),
                    dense_nr._norm_rope_attend_kernel,
                    dict(qr_ptr=bf, kr_ptr=bf, vr_ptr=bf, qw_ptr=bf, kw_ptr=bf, cos_ptr=bf, sin_ptr=bf, qs_ptr=bf,
                         k_ptr=bf, v_ptr=bf, out_ptr=bf, scale="fp32", inv_d="fp32", q_eps="fp32", k_eps="fp32",
                         x_ptr=bf, inv_h="fp32", x_eps="fp32"),
                    dict(GROUPS=2, GP=2, D=128, BLOCK_HALF=64, BLOCK_T=16, USE_PDL=pdl, FOLDED=folded, BLOCK_X=1024,
                         NEW=new),
                    dict(enable_fp_fusion=False, launch_pdl=pdl)))
    for append in (False, True):
        out.append((f"dense_decode append={append}", dense._dense_decode_kernel,
                    dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, out_ptr=bf, kn_ptr=bf, vn_ptr=bf, scale="fp32"),
                    dict(GROUPS=2, GP=2, D=128, BLOCK_T=16, APPEND=append), {}))
    paged_args = dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, table_ptr=i64, lens_ptr=i64, out_ptr=bf, part_m_ptr=f32,
                      part_l_ptr=f32, part_acc_ptr=f32, kn_ptr=bf, vn_ptr=bf, slot_ptr=i64, scale_log2="fp32")
    for append, pdl in ((False, False), (True, False), (True, True)):
        out.append((f"paged_decode append={append}" + (" pdl" if pdl else ""), paged._paged_decode_kernel,
                    paged_args,
                    dict(GROUP=2, BLOCK_G=2, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=16, NUM_SPLITS=8,
                         APPEND=append, TENSOR_CORES=False, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32",
                         SMALL_POOL=True, USE_PDL=pdl, LOOP_STAGES=1), dict(num_warps=2, launch_pdl=pdl)))
    # The tensor-core variant: the default launch (32-token tiles, 4 warps; int32 and int64 offsets, 1 and 2
    # splits) and call 3's 64-token tiles at 8 warps, each with the tile loop pipelined (LOOP_STAGES 2: the default
    # since session 51) and plain (1: VOXFLOW_PAGED_DECODE_STAGES=1).
    for block_n, warps, splits, small, pdl in ((32, 4, 1, True, False), (32, 4, 1, True, True),
                                               (32, 4, 2, False, False), (32, 4, 2, False, True),
                                               (64, 8, 1, True, False)):
        for loop_stages in (2, 1):
            out.append((f"paged_decode tensor_cores block_n={block_n} warps={warps} splits={splits} int32={small}"
                        + (" pdl" if pdl else "") + ("" if loop_stages == 2 else " plain loop"),
                        paged._paged_decode_kernel, paged_args,
                        dict(GROUP=2, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=block_n,
                             NUM_SPLITS=splits, APPEND=True, TENSOR_CORES=True, DOT_DTYPE=tl.bfloat16,
                             DOT_PRECISION="tf32", SMALL_POOL=small, USE_PDL=pdl, LOOP_STAGES=loop_stages),
                        dict(num_warps=warps, num_stages=2, launch_pdl=pdl)))
    # The tile loop at 3 stages (session 50: 2 stages cp.async and 128 registers, no spill; 3: 168, 24 bytes spilled).
    out.append(("paged_decode tensor_cores loop_stages=3", paged._paged_decode_kernel, paged_args,
                dict(GROUP=2, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=32, NUM_SPLITS=1,
                     APPEND=True, TENSOR_CORES=True, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32",
                     SMALL_POOL=True, USE_PDL=True, LOOP_STAGES=3),
                dict(num_warps=4, num_stages=2, launch_pdl=True)))
    # fp8 pools (kv_cache_dtype=fp8) with bf16 queries: the served variant (tensor cores, appending, its loop
    # pipelined) and the CUDA-core one small batches take.
    fp8_args = dict(paged_args, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", kn_ptr="*fp8e4nv", vn_ptr="*fp8e4nv")
    for tensor_cores in (True, False):
        out.append((f"paged_decode fp8 pools tensor_cores={tensor_cores}", paged._paged_decode_kernel, fp8_args,
                    dict(GROUP=2, BLOCK_G=16 if tensor_cores else 2, HEAD_DIM=128, BLOCK_D=128, PAGE=16,
                         BLOCK_N=32 if tensor_cores else 16, NUM_SPLITS=1 if tensor_cores else 8, APPEND=True,
                         TENSOR_CORES=tensor_cores, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", SMALL_POOL=True,
                         USE_PDL=True, LOOP_STAGES=2 if tensor_cores else 1),
                    dict(num_warps=4 if tensor_cores else 2, launch_pdl=True)))
    for pdl in (False, True):
        out.append(("paged_decode combine_splits" + (" pdl" if pdl else ""), paged._combine_splits_kernel,
                    dict(part_m_ptr=f32, part_l_ptr=f32, part_acc_ptr=f32, out_ptr=bf),
                    dict(NUM_HEADS=16, HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=8, BLOCK_S=8, USE_PDL=pdl),
                    dict(launch_pdl=pdl)))
    from voxflow.kernels import paged_prefill_attention as prefill

    def prefill_case(name: str, q: str, kv: str, rows: int, stages: int, precision: str = "tf32",
                     block_n: int = 32) -> tuple:
        return (f"paged_prefill {name}", prefill._paged_prefill_kernel,
                dict(q_ptr=q, k_ptr=kv, v_ptr=kv, table_ptr=i64, tile_row_ptr=i64, tile_rows_ptr=i64,
                     tile_chunk_ptr=i64, tile_pos_ptr=i64, out_ptr=q, scale_log2="fp32"),
                dict(GROUP=2, ROWS=rows, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=block_n, DOT_PRECISION=precision,
                     DOT_IN_FP32=False, LOOP_STAGES=stages), dict(num_warps=prefill.default_warps(rows)))

    tile, stages = prefill.TILE_ROWS, prefill.LOOP_STAGES          # the defaults: 32 queries, 2 stages
    for dt, precision, dtype in (("bf16", "tf32", torch.bfloat16), ("fp32", "ieee", torch.float32)):
        out.append(prefill_case(dt, _ptr(dt), _ptr(dt), tile, stages, precision, prefill.default_block_n(dtype)))
    out.append(prefill_case("fp8 pools", bf, "*fp8e4nv", tile, stages))
    # the other settings VOXFLOW_PREFILL_TILE_ROWS / VOXFLOW_PAGED_PREFILL_STAGES take, at the warps the launch picks
    # for them (4 at 16 queries, 8 above: no spill)
    for rows in (16, 32, 64):
        for loop in (1, 2, 3):
            if (rows, loop) != (tile, stages) and (loop < 3 or rows == 16):
                out.append(prefill_case(f"bf16 {rows} queries loop_stages={loop}", bf, bf, rows, loop))
    for dt, more in (("bf16", 0), ("fp32", 0), ("bf16", 15)):
        p = _ptr(dt)
        out.append((f"frame_input {dt}" + (f" + {more} rows" if more else ""), frame_input._frame_input_kernel,
                    dict(embed_ptr=p, more_ptr=p, rows_ptr=i64, fed_ptr=i64, trailing_len_ptr=i64,
                         prompt_len_ptr=i64, table_ptr=i64, pages_ptr=p, pad_ptr=p, out_ptr=p, pos_ptr=i64),
                    dict(PAGE_ROWS=32, BLOCK_H=1024, MORE_ROWS=more), {}))
    out.append(("slot_write_back", slot_write_back._slot_write_back_kernel,
                dict(rows_ptr=i64, fed_ptr=i64, frame_ptr=i64, c0_next_ptr=i64, hidden_ptr=bf, max_frames_ptr=i64,
                     c0_tab_ptr=i64, fed_tab_ptr=i64, h_ptr=bf, seen_ptr=_ptr("i8"), hist_ptr=_ptr("i16"),
                     flags_ptr=_ptr("i8")),
                dict(GROUPS=16, BLOCK_H=1024), {}))
    out.append(("uniform_noise", uniform_noise._uniform_noise_kernel, dict(keys_ptr=i64, frame_ptr=i64, out_ptr=f32),
                dict(BLOCK=1024), {}))
    for pdl, folded in ((False, False), (True, False), (False, True)):
        out.append(("qk_norm_rope" + (" pdl" if pdl else "") + (" folded" if folded else ""),
                    qk_norm_rope._qk_norm_rope_kernel,
                    dict(q_ptr=bf, k_ptr=bf, qw_ptr=bf, kw_ptr=bf, cos_ptr=bf, sin_ptr=bf, qo_ptr=bf, ko_ptr=bf,
                         inv_d="fp32", q_eps="fp32", k_eps="fp32", x_ptr=bf, v_ptr=bf, vo_ptr=bf, inv_h="fp32",
                         x_eps="fp32"),
                    dict(BLOCK_H=8, BLOCK_HALF=64, USE_PDL=pdl, FOLDED=folded, BLOCK_X=2048),
                    dict(num_warps=4, enable_fp_fusion=False, launch_pdl=pdl)))
    out.append(("rms_norm", rms_norm._rms_norm_kernel,
                dict(x_ptr=bf, res_ptr=bf, w_ptr=bf, out_ptr=bf, sum_ptr=bf, scale_ptr=bf, inv_n="fp32", eps="fp32"),
                dict(HAS_RESIDUAL=True, HAS_SCALE=False, BLOCK=2048), dict(enable_fp_fusion=False)))
    out.append(("rms_norm scaled fp16", rms_norm._rms_norm_kernel,  # the codec transformer's LayerScale'd adds
                dict(x_ptr=h, res_ptr=h, w_ptr=h, out_ptr=h, sum_ptr=h, scale_ptr=h, inv_n="fp32", eps="fp32"),
                dict(HAS_RESIDUAL=True, HAS_SCALE=True, BLOCK=512), dict(enable_fp_fusion=False)))
    out.append(("silu_mul", silu_mul._silu_mul_kernel, dict(gate_ptr=bf, up_ptr=bf, out_ptr=bf),
                dict(PRECISE_EXP=True, BLOCK=1024), dict(num_warps=4, enable_fp_fusion=False)))
    out.append(("silu_mul folded", silu_mul._silu_mul_folded_kernel,
                dict(gate_ptr=bf, up_ptr=bf, x_ptr=bf, out_ptr=bf, inv_h="fp32", eps="fp32"),
                dict(PRECISE_EXP=True, BLOCK=1024, BLOCK_X=1024), dict(num_warps=4, enable_fp_fusion=False)))
    return out


def _conv_constexprs(dt: str, k: int, epilogue: str | None, cfg: dict) -> dict:
    """The convolution kernels' constexprs as conv1d_channels_last passes them (dilation 3, a bias); epilogue: the
    words SNAKE, RESIDUAL, ACTIVATE, RAW_OUT it sets (or None)."""
    from voxflow.kernels import causal_conv
    words = (epilogue or "").split()
    return dict(KSIZE=k, DILATION=3, HAS_BIAS=True, **{w: w in words for w in ("SNAKE", "RESIDUAL", "ACTIVATE",
                                                                               "RAW_OUT")},
                PRECISE=causal_conv.epilogue_sin_mode(True, _DTYPE_OF[dt], "tf32" if dt == "fp32" else "ieee"),
                DOT_PRECISION="tf32" if dt == "fp32" else "ieee", DOT_IN_FP32=False,
                **{key: v for key, v in cfg.items() if key.isupper()})


def conv_channels_last_case(dt: str, cin: int, k: int, epilogue: str | None, cfg: dict, aligned: tuple) -> tuple:
    """(kernel, types, constexprs, options) of causal_conv.py's convolution as conv1d_channels_last launches it."""
    from voxflow.kernels import causal_conv
    p = _ptr(dt)
    consts = dict(_conv_constexprs(dt, k, epilogue, cfg), EVEN_K=cin % cfg["BLOCK_K"] == 0)
    return (causal_conv._conv_cl_kernel,
            dict(x_ptr=p, w_ptr=p, bias_ptr=p, a_ptr=p, inv_ptr=p, res_ptr=p, a2_ptr=p, inv2_ptr=p, raw_ptr=p,
                 out_ptr=p), consts,
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False, aligned=aligned,
                 **({"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg else {})))


def conv_tma_case(dt: str, k: int, epilogue: str | None, cfg: dict, flat: bool = False) -> tuple:
    """(kernel, types, constexprs, options) of causal_conv.py's TMA convolution as `_conv_tma` launches it (flat:
    tiles across sequences, causal_conv.tma_tiling)."""
    from voxflow.kernels import causal_conv
    p = _ptr(dt)
    bt, bn, bk = cfg["BLOCK_T"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    bn2 = cfg.get("BLOCK_N2", 16)                       # (the split's second accumulator; a dummy width without it)
    split = "BLOCK_N2" in cfg
    types = dict(x_desc=f"tensordesc<{dt}[1,{bt},{bk}]>", w_desc=f"tensordesc<{dt}[{bn},{bk}]>",
                 w2_desc=f"tensordesc<{dt}[{bn2 if split else bn},{bk}]>", bias_ptr=p, a_ptr=p,
                 inv_ptr=p, res_ptr=p, a2_ptr=p, inv2_ptr=p, raw_ptr=p, out_ptr=p)
    aligned = ("bias_ptr", "a_ptr", "inv_ptr", "res_ptr", "a2_ptr", "inv2_ptr", "raw_ptr", "out_ptr", "COUT", "res_sb",
               "res_st", "raw_sb", "raw_st", "out_sb", "out_st")
    return (causal_conv._conv_cl_tma_kernel, types,
            {**_conv_constexprs(dt, k, epilogue, cfg), "SPLIT_N": split, "BLOCK_N2": bn2, "FLAT": flat},
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False, aligned=aligned))


def residual_unit_case(dt: str, dtype: torch.dtype, channels: int = 96) -> tuple:
    """(kernel, types, constexprs, options) of residual_unit.py's kernel as the waveform stack launches it."""
    from voxflow.kernels import residual_unit
    cfg = residual_unit.launch_config(dtype)
    p = _ptr(dt)
    ptrs = ("x_ptr", "w7_ptr", "b7_ptr", "a_ptr", "inv_ptr", "w1_ptr", "b1_ptr", "res_ptr", "out_ptr")
    consts = dict(DILATION=3, PRECISE=2, DOT_PRECISION="tf32" if dt == "fp32" else "ieee", DOT_IN_FP32=False,
                  EVEN_K=channels % cfg["BLOCK_K"] == 0, BLOCK_T=cfg["BLOCK_T"],
                  BLOCK_C=triton.next_power_of_2(channels), BLOCK_K=cfg["BLOCK_K"])
    return (residual_unit._residual_unit_kernel, {q: p for q in ptrs}, consts,
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False,
                 aligned=ptrs + ("C", "x_sb", "x_st", "res_sb", "res_st", "out_sb", "out_st")))


def residual_unit_tma_case(channels: int, epilogue: str, config: dict | None = None) -> tuple:
    """(kernel, types, constexprs, options) of residual_unit_tma.py's kernel as `residual_unit_tma` launches it (at
    CONFIGS[channels], or `config`'s tiles for a sweep)."""
    from voxflow.kernels import causal_conv, residual_unit_tma
    cfg = config or residual_unit_tma.CONFIGS[channels]
    bt, bn, bn2, bk = cfg["BLOCK_T"], cfg["BLOCK_N"], cfg["BLOCK_N2"], cfg["BLOCK_K"]
    p = _ptr("fp16")
    ptrs = ("b7_ptr", "a_ptr", "inv_ptr", "w1_ptr", "b1_ptr", "res_ptr", "a2_ptr", "inv2_ptr", "raw_ptr", "out_ptr")
    types = dict(x_desc=f"tensordesc<fp16[1,{bt},{bk}]>", w_desc=f"tensordesc<fp16[{bn},{bk}]>",
                 w2_desc=f"tensordesc<fp16[{bn2},{bk}]>", **{q: p for q in ptrs})
    words = epilogue.split()
    consts = dict(DILATION=3, ACTIVATE="ACTIVATE" in words, RAW_OUT="RAW_OUT" in words,
                  PRECISE=causal_conv.epilogue_sin_mode(True, torch.float16, "ieee"), DOT_PRECISION="ieee",
                  DOT_IN_FP32=False, BLOCK_T=bt, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=bk)
    return (residual_unit_tma._residual_unit_tma_kernel, types, consts,
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False,
                 aligned=ptrs + ("C", "res_sb", "res_st", "raw_sb", "raw_st", "out_sb", "out_st")))


def norm_linear_case(m: int, n: int, k: int, swiglu: bool, config: dict | None = None, norm: bool = True,
                     residual: bool = False, pdl: bool | int = False, preload: bool = False) -> tuple:
    """(kernel, types, constexprs, options) of norm_linear.py's kernel as launched for [m, k] x [n(, x2), k]."""
    from voxflow.kernels import norm_linear
    cfg = {**norm_linear.launch_config(m, n, k, swiglu), **(config or {})}
    bf = _ptr("bf16")
    consts = dict(NORM=norm, SWIGLU=swiglu, HAS_RES=residual, PRECISE_EXP=True, USE_PDL=pdl,
                  BLOCK_M=triton.next_power_of_2(m), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], PRELOAD=preload)
    if m == 1:
        consts["M"] = 1
    ptrs = ("x_ptr", "g_ptr", "w_ptr", "res_ptr", "out_ptr")
    return (norm_linear._norm_linear_kernel, {**{p: bf for p in ptrs}, "k_float": "fp32", "eps": "fp32"}, consts,
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=bool(pdl),
                 aligned=ptrs + ("N", "K", "stride_xm", "stride_rm", "stride_om")))


def attention_o_proj_case(m: int, config: dict | None = None, pdl: bool | int = False, joint: bool = False
                          ) -> tuple:
    """(kernel, types, constexprs, options) of attention_o_proj.py's kernel at the 1.7B code predictor's shapes
    (joint: its two-token form, m = 2)."""
    from voxflow.kernels import attention_o_proj
    cfg = {**attention_o_proj.launch_config(1024, 16), **(config or {})}
    bf = _ptr("bf16")
    consts = dict(HQ=16, HKV=8, D=128, HALF=64, BLOCK_H=cfg["BLOCK_H"], BLOCK_T=16, BLOCK_N=cfg["BLOCK_N"],
                  USE_PDL=pdl, JOINT=joint)
    if m == 1:
        consts["M"] = 1
    ptrs = ("qkv_ptr", "res_ptr", "wo_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr", "out_ptr")
    return (attention_o_proj._attention_o_proj_kernel,
            {**{p: bf for p in ptrs}, "ws_ptr": _ptr("fp32"), "cnt_ptr": _ptr("i32"), "scale": "fp32",
             "inv_d": "fp32", "q_eps": "fp32", "k_eps": "fp32"}, consts,
            dict(num_warps=cfg["num_warps"], enable_fp_fusion=False, launch_pdl=bool(pdl),
                 aligned=ptrs + ("ws_ptr", "cnt_ptr", "N", "s_qkv", "s_res", "s_out", "cos_sb", "sin_sb", "sk_b",
                                 "sk_h", "sk_t", "sv_b", "sv_h", "sv_t")))


def resource_usage(cubin: bytes) -> str:
    """Registers and stack (spill) bytes per thread of a cubin, from the cuobjdump bundled with Triton ('' when it
    is not there): e.g. 'REG:128 STACK:0'."""
    import os
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "REG:" in line:
            return " ".join(w for w in line.split() if w.startswith(("REG:", "STACK:")))
    return ""


def compile_all(target: GPUTarget = HOPPER, usage: bool = False) -> dict[str, str | None]:
    """name -> None when it compiled to a cubin, else the error (usage: name -> 'ok REG:.. STACK:..' instead of
    None, for the command line)."""
    results = {}
    for name, fn, types, consts, options in cases():
        try:
            asm = compile_kernel(fn, types, consts, target, **options)
            if not asm.get("cubin"):
                results[name] = "no cubin produced"
            else:
                results[name] = f"ok {resource_usage(asm['cubin'])}" if usage else None
        except Exception as e:  # noqa: BLE001 - reported per kernel
            results[name] = f"{type(e).__name__}: {e}"[:2000]
    return results


if __name__ == "__main__":
    for kernel, result in compile_all(usage=True).items():
        print(f"{kernel:44s} {result if result.startswith('ok') else 'FAILED: ' + result}")
