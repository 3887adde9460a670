"""One code-predictor decoder layer for a decode step of many rows (one token each) in five kernels, all with PDL:

    K1 batch_linear.py           qkv = rms_norm(x, input_layernorm) @ W_qkv^T         (norm folded into W_qkv)
    K2 dense_decode_norm_rope.py a   = attention(q/k norm + RoPE, cache + new k/v)    (+ the cache append)
    K3 batch_linear.py           h   = x + a @ W_o^T
    K4 batch_linear.py           act = silu(gate) * up of rms_norm(h, post_attention_layernorm) @ W_gate|up^T  (folded)
    K5 batch_linear.py           out = h + act @ W_down^T                                (written over h)

instead of the per-layer path's ~10 above the skinny sizes (norm, cuBLAS q|k|v, attention, cuBLAS o_proj + split-K
reduce, add + norm, cuBLAS gate|up, silu * up, cuBLAS down + reduce), none of which took part in PDL.
cp_layer.py is the same layer for one row (CUDA-core GEMMs, attention fused with o_proj).

`fold_layer` makes the layer's weights with the norms folded in (batch_linear.fold_norm: a second copy of q|k|v and
gate|up, ~21 MB a layer for the 1.7B code predictor); voxflow/models/qwen3_tts/code_predictor.py keeps them and
owns the switch. Numerics: batch_linear.py's (the folded GEMMs within one rounding of an input of the reference);
the attention kernel and the residual adds have the per-layer path's rounding points.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from voxflow.kernels import batch_linear as bl
from voxflow.kernels import dense_decode_norm_rope as nra


@dataclass(frozen=True)
class BatchLayerWeights:
    """A Qwen3 decoder layer's tensors as the five kernels take them (q|k|v and gate|up with their norms folded)."""
    qkv: torch.Tensor               # [(Hq + 2 Hkv) * D, H] = W_qkv * input_layernorm
    input_eps: float
    q_norm: torch.Tensor
    q_eps: float
    k_norm: torch.Tensor
    k_eps: float
    o: torch.Tensor                 # [H, Hq * D]
    gate_up: torch.Tensor           # [2 I, H] = (gate | up) * post_attention_layernorm
    post_eps: float
    down: torch.Tensor              # [H, I]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float


def fold_layer(qkv: torch.Tensor, input_norm, q_norm, k_norm, o: torch.Tensor, gate_up: torch.Tensor, post_norm,
               down: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, scale: float
               ) -> BatchLayerWeights:
    """The layer's BatchLayerWeights from its fused q|k|v and gate|up weights and its RMSNorm modules (weight, eps)."""
    return BatchLayerWeights(
        qkv=bl.fold_norm(qkv, input_norm.weight), input_eps=input_norm.eps, q_norm=q_norm.weight.contiguous(),
        q_eps=q_norm.eps, k_norm=k_norm.weight.contiguous(), k_eps=k_norm.eps, o=o,
        gate_up=bl.fold_norm(gate_up, post_norm.weight), post_eps=post_norm.eps, down=down, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale)


def _heads(qkv: torch.Tensor, w: BatchLayerWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q|k|v rows [M, (Hq + 2 Hkv) D] -> per-head views q [M, 1, Hq, D], k / v [M, 1, Hkv, D]."""
    m, d = qkv.shape[0], w.head_dim
    nq, nk = w.num_heads * d, w.num_kv_heads * d
    return (qkv[:, :nq].view(m, 1, w.num_heads, d), qkv[:, nq:nq + nk].view(m, 1, w.num_kv_heads, d),
            qkv[:, nq + nk:].view(m, 1, w.num_kv_heads, d))


def supported(x: torch.Tensor, w: BatchLayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              length: int) -> bool:
    """Whether `layer_step` runs for rows x [M, H] at cache position `length` (checked before any launch; the
    conditions of the kernels it launches, on the shapes it will hand them)."""
    if x.dim() != 2 or not x.is_contiguous() or length >= k_cache.shape[2] or torch.is_grad_enabled():
        return False
    m, hidden = x.shape
    d, hq, hkv = w.head_dim, w.num_heads, w.num_kv_heads
    if (w.qkv.shape[0] != (hq + 2 * hkv) * d or hq % hkv or d < 16 or d & (d - 1) or d > 1024
            or w.q_norm.shape != (d,) or w.k_norm.shape != (d,) or cos.shape != sin.shape
            or cos.dim() != 3 or cos.shape[0] not in (1, m) or cos.shape[1:] != (1, d)
            or any(t.dtype != x.dtype or t.device != x.device for t in (w.q_norm, w.k_norm, cos, sin))
            or tuple(k_cache.shape[:2]) != (m, hkv) or k_cache.shape[3] != d):
        return False
    inter = w.down.shape[1]
    plain = [(w.o, (hidden, hq * d)), (w.down, (hidden, inter))]      # the GEMMs whose input a kernel here makes
    return (bl.supported(x, w.qkv) and bl.supported(x, w.gate_up, swiglu=True) and w.gate_up.shape[0] == 2 * inter
            and all(t.shape == shape and t.dtype == x.dtype and t.device == x.device and t.is_contiguous()
                    and t.shape[1] % 16 == 0 and t.numel() < 2 ** 31 for t, shape in plain))


def layer_step(x: torch.Tensor, w: BatchLayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, length: int) -> torch.Tensor:
    """The layer on rows x [M, H] (one new token each, at cache position `length`; row b's cache is
    k_cache[b] / v_cache[b], updated in place) -> new rows [M, H] (x itself is left unchanged)."""
    m = x.shape[0]
    qkv = bl.batch_linear(x, w.qkv, norm_eps=w.input_eps)
    q, k, v = _heads(qkv, w)
    a = nra.norm_rope_attend_append(q, k, v, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, k_cache, v_cache,
                                    length, w.scale).view(m, -1)
    h = bl.batch_linear(a, w.o, residual=x, out=torch.empty_like(x))
    act = bl.batch_linear(h, w.gate_up, norm_eps=w.post_eps, swiglu=True)
    return bl.batch_linear(act, w.down, residual=h, out=h)
