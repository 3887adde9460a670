"""A ConvNeXt block's causal depthwise convolution, its bias and the LayerNorm after it, over channels-last rows, in
one Triton kernel that also writes the stream's next left context.

The codec decoder's two ConvNeXt blocks (models/qwen3_tts/codec_decoder_blocks.ConvNeXtBlock) run between the frame
transformer and the waveform stack, at 2x and 4x the frame rate over 1024 channels. In PyTorch's [B, C, T] layout
each is a concatenation with the carried context, cuDNN's depthwise kernel (~20 us for 16 streams x 50 rows on an
H100, session 54's profile), a transpose copy and a LayerNorm, besides the copy that keeps the next context. Over
rows [B, T, C] a program owns BLOCK_T whole rows: the 7 taps are 7 loads of rows it (or a neighbour) reads anyway,
and the LayerNorm's mean and variance run over the row in registers.

Numerics are PyTorch's rounding points: the convolution with its bias summed in fp32 and rounded once to the
activation dtype (as the convolution stores it), the LayerNorm's statistics and affine map in fp32 on that rounded
value, rounded once. The taps are summed in order 0..K-1 (cuDNN's order is its own: within rounding).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to

BLOCK_T, NUM_WARPS = 4, 8    # rows a program: [4, 1024] fp32 values over 8 warps (16 a thread)


@triton.jit
def _dwconv_layer_norm_kernel(x_ptr, ctx_ptr, w_ptr, b_ptr, nw_ptr, nb_ptr, out_ptr, new_ctx_ptr, T, C, x_sb, x_st,
                              ctx_sb, ctx_sc, new_sb, new_sc, out_sb, out_st, eps, K: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    # grid: (row tiles + 1, sequences); x rows [T, C] of sequence b, its left context ctx [C, K - 1] (oldest
    # first). The last program of a sequence writes its next context, the others BLOCK_T rows each.
    tile = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    c = tl.arange(0, BLOCK_C)
    c_ok = c < C
    ctx_len = K - 1
    if tile == tl.num_programs(0) - 1:
        # the next context: the last K - 1 positions of [context, x] (old context where T < K - 1), as [C, K - 1]
        for p in range(ctx_len):
            src = T - ctx_len + p
            if src >= 0:
                v = tl.load(x_ptr + b * x_sb + src.to(tl.int64) * x_st + c, mask=c_ok)
            else:
                v = tl.load(ctx_ptr + b * ctx_sb + c.to(tl.int64) * ctx_sc + (src + ctx_len), mask=c_ok)
            tl.store(new_ctx_ptr + b * new_sb + c.to(tl.int64) * new_sc + p, v, mask=c_ok)
    else:
        t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = t < T
        acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for j in range(K):                         # tap j reads input position t - (K - 1) + j
            src = t - ctx_len + j
            in_x = row_ok & (src >= 0)
            in_ctx = row_ok & (src < 0)
            xv = tl.load(x_ptr + b * x_sb + src.to(tl.int64)[:, None] * x_st + c[None, :],
                         mask=in_x[:, None] & c_ok[None, :], other=0.0)
            cv = tl.load(ctx_ptr + b * ctx_sb + c[None, :].to(tl.int64) * ctx_sc + (src + ctx_len)[:, None],
                         mask=in_ctx[:, None] & c_ok[None, :], other=0.0)
            w = tl.load(w_ptr + c * K + j, mask=c_ok, other=0.0).to(tl.float32)
            acc += (xv.to(tl.float32) + cv.to(tl.float32)) * w[None, :]
        bias = tl.load(b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        h = tl.where(c_ok[None, :], round_to(acc + bias[None, :], dtype).to(tl.float32), 0.0)
        mean = tl.sum(h, axis=1) / C
        d = tl.where(c_ok[None, :], h - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
        nw = tl.load(nw_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        nb = tl.load(nb_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        y = d * rstd[:, None] * nw[None, :] + nb[None, :]
        tl.store(out_ptr + b * out_sb + t.to(tl.int64)[:, None] * out_st + c[None, :], y.to(dtype),
                 mask=row_ok[:, None] & c_ok[None, :])

def dwconv_layer_norm(x: torch.Tensor, ctx: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      norm_weight: torch.Tensor, norm_bias: torch.Tensor, eps: float, new_ctx: torch.Tensor
                      ) -> torch.Tensor:
    """LayerNorm(depthwise_causal_conv(x) + bias) over channels-last rows -> a new [B, T, C] tensor; the next left
    context written into new_ctx.

    x [B, T, C] (unit channel stride); ctx [B, C, K - 1] (unit time stride: the carried context, oldest first);
    weight [C, 1, K] (nn.Conv1d's depthwise weight); bias, norm_weight, norm_bias [C]; new_ctx [B, C, K - 1] (unit
    time stride, no memory shared with x or ctx): the last K - 1 positions of [ctx, x]."""
    bsz, t, c = x.shape
    k = weight.shape[-1]
    if weight.shape != (c, 1, k) or k < 2:
        raise ValueError(f"a depthwise weight [{c}, 1, K >= 2] for {c} channels, got {tuple(weight.shape)}")
    for name, v in (("bias", bias), ("norm_weight", norm_weight), ("norm_bias", norm_bias)):
        if v.shape != (c,):
            raise ValueError(f"{name} must be [{c}], got {tuple(v.shape)}")
    for name, v in (("ctx", ctx), ("new_ctx", new_ctx)):
        if v.shape != (bsz, c, k - 1) or v.stride(2) != 1 or v.dtype != x.dtype:
            raise ValueError(f"{name} must be [{bsz}, {c}, {k - 1}] {x.dtype} with a unit time stride")
    if x.stride(2) != 1:
        raise ValueError("x needs a unit channel stride")
    if new_ctx.untyped_storage().data_ptr() in {x.untyped_storage().data_ptr(), ctx.untyped_storage().data_ptr()}:
        raise ValueError("new_ctx must not share memory with x or ctx (the kernel reads them while it writes)")
    weight = weight.contiguous()
    out = torch.empty((bsz, t, c), dtype=x.dtype, device=x.device)
    if bsz == 0:
        return out
    grid = (triton.cdiv(t, BLOCK_T) + 1, bsz)          # (+1: the program writing the next context)
    _dwconv_layer_norm_kernel[grid](
        x, ctx, weight, bias, norm_weight, norm_bias, out, new_ctx, t, c, x.stride(0), x.stride(1), ctx.stride(0),
        ctx.stride(1), new_ctx.stride(0), new_ctx.stride(1), out.stride(0), out.stride(1), eps, K=k, BLOCK_T=BLOCK_T,
        BLOCK_C=triton.next_power_of_2(c), num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out

