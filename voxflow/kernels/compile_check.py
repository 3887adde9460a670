"""Compile every Triton kernel of voxflow for an NVIDIA Hopper GPU (sm_90, the H200) on a machine without one.

Triton's interpreter (the CPU tests) checks what a kernel computes, not that it compiles: a construct the GPU
front end or ptxas rejects only shows on the device, where time is scarce. `compile_all()` runs Triton's real
compiler (front end, LLVM, ptxas as bundled with the triton wheel) for a GPU target with representative
signatures and constexpr configurations, no GPU needed. Used by tests/test_kernels_compile.py and as

    python -m voxflow.kernels.compile_check
"""
from __future__ import annotations

import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)


def _ptr(t: str) -> str:
    return "*" + t


def compile_kernel(fn, types: dict, constexprs: dict, target: GPUTarget = HOPPER, **options) -> dict:
    """Compile `fn` (an @triton.jit function) for `target`; arguments not named in `types` are i32 scalars."""
    params = list(inspect.signature(fn.fn).parameters)
    signature = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(params.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=target, options=options).asm


def cases() -> list[tuple[str, object, dict, dict, dict]]:
    """(name, kernel, argument types, constexprs, launch options) for each kernel and its main configurations."""
    from voxflow.kernels import dense_decode_attention as dense
    from voxflow.kernels import dense_decode_norm_rope as dense_nr
    from voxflow.kernels import paged_decode_attention as paged
    from voxflow.kernels import qk_norm_rope, rms_norm, select_tokens, silu_mul, skinny_linear, snake_beta
    from voxflow.kernels import uniform_noise
    bf, f32, i64 = _ptr("bf16"), _ptr("fp32"), _ptr("i64")
    out = []
    for top_p, talker in ((False, False), (True, False), (False, True)):
        out.append((f"select_tokens top_p={top_p} talker={talker}", select_tokens._select_tokens_kernel,
                    dict(logits_ptr=bf, do_sample_ptr=_ptr("u8"), temperature_ptr=f32, top_k_ptr=i64,
                         top_p_ptr=_ptr("fp64"), keys_ptr=i64, frame_ptr=i64, out_ptr=i64, seen_ptr=_ptr("u8"),
                         penalty_ptr=f32, num_gen_ptr=i64, min_new_ptr=i64, suppress_ptr=_ptr("u8")),
                    dict(USE_TOP_P=top_p, PRECISE=True, TALKER=talker, BLOCK=4096),
                    dict(num_warps=8, enable_fp_fusion=False)))
    for dt in ("fp32", "bf16"):
        p = _ptr(dt)
        for has_bias in (False, True):
            out.append((f"snake_beta {dt} bias={has_bias}", snake_beta._snake_beta_kernel,
                        dict(x_ptr=p, a_ptr=p, inv_ptr=p, bias_ptr=p, out_ptr=p),
                        dict(HAS_BIAS=has_bias, PRECISE=True, BLOCK=1024), dict(num_warps=4, enable_fp_fusion=False)))
        out.append((f"bias_residual {dt}", snake_beta._bias_residual_kernel,
                    dict(h_ptr=p, bias_ptr=p, x_ptr=p, out_ptr=p), dict(BLOCK=1024),
                    dict(num_warps=4, enable_fp_fusion=False)))
    skinny_types = dict(x_ptr=bf, w_ptr=bf, nw_ptr=bf, bias_ptr=bf, res_ptr=bf, out_ptr=bf, ws_ptr=f32,
                        k_float="fp32", eps="fp32")
    for m in (1, 4, 8, 64):
        for fused in (dict(NORM=True), dict(GATED=True, HAS_RES=True), dict(HAS_BIAS=True, HAS_RES=True)):
            cfg = skinny_linear.launch_config(m, 1024, 3072, None)
            consts = dict(NORM=False, GATED=False, HAS_BIAS=False, HAS_RES=False, PRECISE_EXP=True, DOT_IN_FP32=False)
            consts.update(fused)
            consts.update({k: v for k, v in cfg.items() if k.isupper()})
            out.append((f"skinny_linear m={m} {'+'.join(k for k in fused)}", skinny_linear._skinny_linear_kernel,
                        skinny_types, consts, dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])))
    out.append(("dense_decode_norm_rope", dense_nr._norm_rope_attend_kernel,
                dict(qr_ptr=bf, kr_ptr=bf, vr_ptr=bf, qw_ptr=bf, kw_ptr=bf, cos_ptr=bf, sin_ptr=bf, qs_ptr=bf,
                     k_ptr=bf, v_ptr=bf, out_ptr=bf, scale="fp32", inv_d="fp32", q_eps="fp32", k_eps="fp32"),
                dict(GROUPS=2, GP=2, D=128, BLOCK_HALF=64, BLOCK_T=16), dict(enable_fp_fusion=False)))
    for append in (False, True):
        out.append((f"dense_decode append={append}", dense._dense_decode_kernel,
                    dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, out_ptr=bf, kn_ptr=bf, vn_ptr=bf, scale="fp32"),
                    dict(GROUPS=2, GP=2, D=128, BLOCK_T=16, APPEND=append), {}))
        out.append((f"paged_decode append={append}", paged._paged_decode_kernel,
                    dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, table_ptr=i64, lens_ptr=i64, out_ptr=bf, part_m_ptr=f32,
                         part_l_ptr=f32, part_acc_ptr=f32, kn_ptr=bf, vn_ptr=bf, slot_ptr=i64, scale_log2="fp32"),
                    dict(GROUP=2, BLOCK_G=2, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=16, NUM_SPLITS=8,
                         APPEND=append), dict(num_warps=2)))
    out.append(("uniform_noise", uniform_noise._uniform_noise_kernel, dict(keys_ptr=i64, frame_ptr=i64, out_ptr=f32),
                dict(BLOCK=1024), {}))
    out.append(("qk_norm_rope", qk_norm_rope._qk_norm_rope_kernel,
                dict(q_ptr=bf, k_ptr=bf, qw_ptr=bf, kw_ptr=bf, cos_ptr=bf, sin_ptr=bf, qo_ptr=bf, ko_ptr=bf,
                     inv_d="fp32", q_eps="fp32", k_eps="fp32"), dict(BLOCK_H=8, BLOCK_HALF=64),
                dict(num_warps=4, enable_fp_fusion=False)))
    out.append(("rms_norm", rms_norm._rms_norm_kernel,
                dict(x_ptr=bf, res_ptr=bf, w_ptr=bf, out_ptr=bf, sum_ptr=bf, inv_n="fp32", eps="fp32"),
                dict(HAS_RESIDUAL=True, BLOCK=2048), dict(enable_fp_fusion=False)))
    out.append(("silu_mul", silu_mul._silu_mul_kernel, dict(gate_ptr=bf, up_ptr=bf, out_ptr=bf),
                dict(PRECISE_EXP=True, BLOCK=1024), dict(num_warps=4, enable_fp_fusion=False)))
    return out


def compile_all(target: GPUTarget = HOPPER) -> dict[str, str | None]:
    """name -> None when it compiled to a cubin, else the error."""
    results = {}
    for name, fn, types, consts, options in cases():
        try:
            asm = compile_kernel(fn, types, consts, target, **options)
            results[name] = None if asm.get("cubin") else "no cubin produced"
        except Exception as e:  # noqa: BLE001 - reported per kernel
            results[name] = f"{type(e).__name__}: {e}"[:2000]
    return results


if __name__ == "__main__":
    for kernel, error in compile_all().items():
        print(f"{kernel:44s} {'ok' if error is None else 'FAILED: ' + error}")
