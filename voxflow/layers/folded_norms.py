"""A decoder layer's two RMSNorms folded into the GEMMs after them, for decode steps above the skinny sizes.

Why: there a Qwen3 layer step on the kernel path is ~9 launches (norm, q|k|v, attention core, o_proj, add + norm,
gate|up, silu * up, down_proj, plus cuBLAS's split-K reduces), each a few microseconds at 64 rows, and the code
predictor runs 70 of them a frame. RMSNorm(x) @ W^T = r * (x @ (W * g)^T) per row, with g the norm weight and
r = rsqrt(mean(x^2) + eps) the row's factor. So the norm weight goes into a copy of the GEMM weight, made once
(`folded_weights`), and r is applied by the kernel that reads the GEMM's output anyway: for q|k|v the code
predictor's attention core (voxflow/kernels/dense_decode_norm_rope.py, `folded_norm=`) or, before the talker's
paged attention, qk_norm_rope (voxflow/kernels/qk_norm_rope.py, `folded=`, which scales v too); for gate|up the
silu * up kernel (voxflow/kernels/silu_mul.py, `silu_mul_folded`); each computes r from the row the GEMM read. With
the residual adds done by the GEMMs before them (addmm: o_proj's output onto x, down_proj's onto h, in place from a
stack's second layer on), a layer step has no norm kernel and no separate add (Qwen3DecoderLayer._forward_folded,
Qwen3Attention.attend_folded).

Numerics against the reference layer: the reference rounds x * r to the activation dtype, multiplies by g and
rounds again before the GEMM; here the GEMM reads x and g rides in the weight, rounded once into it (fp32
products rounded to the weight dtype); the GEMM output is scaled by r in fp32 and rounded (`scale_rows`), and
each residual add is rounded once with its GEMM instead of after the GEMM's own rounding. So in bf16 every GEMM
input differs from the reference's by about one bf16 rounding (as norm_linear.py's one-row fold); in fp32 only
by summation order and fp32 roundings.
"""
from __future__ import annotations

import torch

from voxflow.layers.derived_weights import per_weight_version


def fold_norm(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] with the RMSNorm weight [K] of its input folded in: W * g per column, in fp32, rounded once."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def folded_weights(layer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q|k|v with the input norm folded in, gate|up with the post-attention norm folded in) of a
    Qwen3DecoderLayer, kept on the layer per weight version; None while they cannot be made (the fused weights do
    not exist yet, or a CUDA graph is being captured before they do)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.fused_qkv(), mlp.fused_gate_up()
    if qkv is None or gate_up is None:
        return None
    if getattr(layer, "norms_folded_in_place", False):
        return qkv, gate_up                 # (fold_norms_in_place: the norm weights are ones now)
    # The Linears' own weights too: they are views of the fused tensors, but an in-place edit through one of them
    # bumps only its own version counter, not the fused tensor's.
    params = (qkv, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, layer.input_layernorm.weight,
              gate_up, mlp.gate_proj.weight, mlp.up_proj.weight, layer.post_attention_layernorm.weight)
    cached = layer._derived
    if cached is None and qkv.is_cuda and torch.cuda.is_current_stream_capturing():
        return None         # never allocate inside a capture (per_weight_version would not keep it either)
    return per_weight_version(layer, params, lambda: (fold_norm(qkv, layer.input_layernorm.weight),
                                                      fold_norm(gate_up, layer.post_attention_layernorm.weight)))


def fold_norms_in_place(layer) -> None:
    """Both RMSNorm weights of a Qwen3DecoderLayer folded into its fused q|k|v and gate|up weights themselves, the
    norm weights then set to one. Every path through the layer (prefill, one row, the folded decode step) computes
    the same function as before, each GEMM input within one rounding of it (the fold's numerics above), and
    `folded_weights` hands out the layer's own weights instead of folded copies: the talker's fold
    (qwen3_layer.FOLDED_NORMS_PAGED) costs no memory (the copies would be ~0.55 GiB for the 0.6B's 28 layers).
    Once per layer, after loading and any cast."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.fused_qkv(), mlp.fused_gate_up()
    if qkv is None or gate_up is None:
        raise RuntimeError("the layer's fused weights do not exist (inside a CUDA graph capture?)")
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    with torch.no_grad():
        qkv.copy_(fold_norm(qkv, norms[0]))         # (in place: the q/k/v and gate/up Linears are views of these)
        gate_up.copy_(fold_norm(gate_up, norms[1]))
        for w in norms:
            w.fill_(1.0)
    layer.norms_folded_in_place = True


def fold_final_norm_in_place(norm, heads) -> None:
    """A stack's final RMSNorm weight folded into the heads that read its output (each head's [V, H] weight times
    the norm weight per column, in fp32, rounded once), the norm weight then set to one: every path computes the
    same function as before (each head input within one rounding of it), and a caller may leave the norm out and
    scale the heads' outputs by the rows' factor instead (the code predictor's CP_FOLDED_HEAD: select_tokens'
    row_scale). Once, after loading and any cast; the norm is marked (`folded_into_heads`)."""
    with torch.no_grad():
        for head in heads:
            head.weight.copy_(fold_norm(head.weight, norm.weight))
        norm.weight.fill_(1.0)
    norm.folded_into_heads = True


def row_factor(x: torch.Tensor, eps: float) -> torch.Tensor:
    """rsqrt(mean(x^2) + eps) per row of x [..., H], in fp32 (the reference RMSNorm's statistics), shape [..., 1]."""
    x32 = x.to(torch.float32)
    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def scale_rows(t: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """t [B, ..., N] (a folded GEMM's output for the rows x [B, H]) times x's row factor, rounded to t's dtype:
    what the kernels do to the raw projections."""
    r = row_factor(x, eps).view(x.shape[0], *([1] * (t.dim() - 1)))
    return (t.to(torch.float32) * r).to(t.dtype)


def silu_mul_folded_reference(gate: torch.Tensor, up: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch form of voxflow/kernels/silu_mul.py's silu_mul_folded: gate and up scaled by x's row factor, then
    silu(gate) * up with the reference's roundings."""
    g, u = scale_rows(gate, x, eps), scale_rows(up, x, eps)
    return torch.nn.functional.silu(g) * u
