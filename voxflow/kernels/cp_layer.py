"""One code-predictor decoder layer for a decode step (one token per row) in four or five kernels. A few rows
(up to SMALL_MAX_M) in four:

    K1 norm_linear.py        qkv = rms_norm(x, input_layernorm) @ W_qkv^T           (the norm rides in the GEMM)
    K2 attention_o_proj.py   h   = x + o_proj(attention(q/k norm + RoPE, cache + new k/v))   (+ the cache append)
    K3 norm_linear.py        act = silu(gate) * up of rms_norm(h, post_attention_layernorm) @ W_gate|up^T
    K4 skinny_linear.py      out = h + act @ W_down^T                                (written over h)

instead of seven (norm, cuBLAS q|k|v, norm/RoPE/attention, skinny o_proj, norm, cuBLAS gate|up, skinny down_proj
with silu * up in its prologue: ~30 us per layer step on an H200 at batch 1 for ~9 us of weight reads).

A decode batch (SMALL_MAX_M < M <= MAX_M: the code predictor at c=16 / c=64) in five, on tensor cores:

    K1 norm_linear.py            qkv = rms_norm(x) @ W_qkv^T                        (norm_linear's tl.dot kernel)
    K2 dense_decode_norm_rope.py a   = attention(q/k norm + RoPE, cache + new k/v)   (+ the cache append)
    K3 skinny_linear.py          h   = x + a @ W_o^T
    K4 norm_linear.py            act = silu(gate) * up of rms_norm(h) @ W_gate|up^T
    K5 skinny_linear.py          out = h + act @ W_down^T                            (written over h)

instead of the per-layer path's nine or more (rms_norm, cuBLAS q|k|v, the attention kernel, cuBLAS o_proj with its
split-K reduce, add + rms_norm, cuBLAS gate|up, silu_mul, cuBLAS down_proj with its split-K reduce, the add: ~42 us
a layer step at 64 rows on an H200 against ~7 us of weight reads, benchmarks/results/h200/2026-12-01-session8/
call4/profile_step_64.txt). (attention_o_proj.py's one program per column block redoes every row's attention:
fine for a few rows, not for 64.)

The functions here take tensors only (`LayerWeights`), so the kernels stay independent of the nn.Modules;
voxflow/models/qwen3_tts/code_predictor.py builds the weights from a Qwen3DecoderLayer and owns the switch.

Numerics against the torch layer (voxflow/layers/qwen3_layer.py): the q/k norms, RoPE, attention, o_proj, the
residual adds and silu * up have the existing kernels' rounding points; the two RMSNorms in front of GEMMs do not
round their normed rows (norm_linear.py says why and by how much), so bf16 results drift from the reference by
about one bf16 rounding of those GEMM inputs per layer. fp32: the reference up to summation order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from voxflow.kernels import attention_o_proj as attn
from voxflow.kernels import dense_decode_norm_rope as dense_nr
from voxflow.kernels import norm_linear as nl
from voxflow.kernels import skinny_linear as sk

SMALL_MAX_M = min(nl.FMA_MAX_M, attn.MAX_M)      # the four-kernel form up to here
MAX_M = min(nl.MAX_M, sk.MAX_M)                  # the five-kernel form above it

# Launch-config overrides per kernel (None: each module's launch_config), e.g. from benchmarks/scripts/
# tune_cp_layer.py's table; "lm_head": the code predictor's norm + lm_head through norm_linear (when it is on).
# down: 4 columns a program (H200, M = 1: 4.92 us vs 5.13 at skinny_linear's 8).
CONFIGS: dict[str, dict | None] = {"qkv": None, "attention_o_proj": None, "gate_up": None,
                                   "down": dict(BLOCK_N=4), "lm_head": None}


# The same for the batch form's kernels (None: norm_linear / skinny_linear's launch_config).
BATCH_CONFIGS: dict[str, dict | None] = {"qkv": None, "o_proj": None, "gate_up": None, "down": None}


@dataclass(frozen=True)
class LayerWeights:
    """A Qwen3 decoder layer's tensors as the four kernels take them (fused q|k|v and gate|up weights)."""
    input_norm: torch.Tensor
    input_eps: float
    qkv: torch.Tensor               # [(Hq + 2 Hkv) * D, H]
    q_norm: torch.Tensor
    q_eps: float
    k_norm: torch.Tensor
    k_eps: float
    o: torch.Tensor                 # [H, Hq * D]
    post_norm: torch.Tensor
    post_eps: float
    gate_up: torch.Tensor           # [2 I, H] = gate | up
    down: torch.Tensor              # [H, I]
    num_heads: int
    scale: float


def supported(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor) -> bool:
    """Whether `layer_step` runs for rows x [M, H] (checked before any launch)."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        return False
    m = x.shape[0]
    inter = w.gate_up.shape[0] // 2
    down = w.down       # the last kernel reads act [M, inter], contiguous (skinny_linear's own size rules)
    down_ok = (down.shape == (x.shape[1], inter) and down.dtype == x.dtype and down.device == x.device
               and down.is_contiguous() and inter % 16 == 0 and down.numel() < 2 ** 31)
    if not (down_ok and nl.supported(x, w.qkv, w.input_norm) and nl.supported(x, w.gate_up, w.post_norm, swiglu=True)):
        return False
    if m <= SMALL_MAX_M:
        return attn.supported(None, x, w.o, w.q_norm, w.k_norm, cos, sin, k_cache, v_cache, w.num_heads,
                              qkv_width=w.qkv.shape[0])
    q, k, v = _split_qkv(x.new_empty(m, w.qkv.shape[0]), w, k_cache.shape[1])
    return (dense_nr.supported(q, k, v, w.q_norm, w.k_norm, cos, sin) and k_cache.shape[0] == m
            and k_cache.shape[1:] == v_cache.shape[1:] and v_cache.shape[0] == m
            and w.o.shape == (x.shape[1], q.shape[2] * q.shape[3]) and w.o.dtype == x.dtype and w.o.is_contiguous())


def _split_qkv(qkv: torch.Tensor, w: LayerWeights, num_kv_heads: int):
    """qkv [M, (Hq + 2 Hkv) D] -> per-head views q [M, 1, Hq, D], k / v [M, 1, Hkv, D]."""
    m = qkv.shape[0]
    d = qkv.shape[1] // (w.num_heads + 2 * num_kv_heads)
    nq, nk = w.num_heads * d, num_kv_heads * d
    return (qkv[:, :nq].view(m, 1, w.num_heads, d), qkv[:, nq:nq + nk].view(m, 1, num_kv_heads, d),
            qkv[:, nq + nk:].view(m, 1, num_kv_heads, d))


def layer_step(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, length: int) -> torch.Tensor:
    """The layer on rows x [M, H] (one new token each, at cache position `length`; row b's cache is
    k_cache[b] / v_cache[b], updated in place) -> new rows [M, H] (x itself is left unchanged)."""
    if x.shape[0] > SMALL_MAX_M:
        return _batch_step(x, w, cos, sin, k_cache, v_cache, length)
    qkv = nl.norm_linear(x, w.qkv, w.input_norm, w.input_eps, config=CONFIGS["qkv"])
    h = attn.attention_o_proj(qkv, x, w.o, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, k_cache, v_cache, length,
                              w.num_heads, w.scale, config=CONFIGS["attention_o_proj"])
    act = nl.norm_linear(h, w.gate_up, w.post_norm, w.post_eps, swiglu=True, config=CONFIGS["gate_up"])
    return sk.skinny_linear(act, w.down, residual=h, out=h, config=CONFIGS["down"])


def _batch_step(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, length: int) -> torch.Tensor:
    """`layer_step` for more than SMALL_MAX_M rows: the five kernels of the module docstring."""
    m = x.shape[0]
    qkv = nl.norm_linear(x, w.qkv, w.input_norm, w.input_eps, config=BATCH_CONFIGS["qkv"])
    q, k, v = _split_qkv(qkv, w, k_cache.shape[1])
    a = dense_nr.norm_rope_attend_append(q, k, v, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, k_cache, v_cache,
                                         length, w.scale)
    h = sk.skinny_linear(a.view(m, -1), w.o, residual=x, config=BATCH_CONFIGS["o_proj"])
    act = nl.norm_linear(h, w.gate_up, w.post_norm, w.post_eps, swiglu=True, config=BATCH_CONFIGS["gate_up"])
    return sk.skinny_linear(act, w.down, residual=h, out=h, config=BATCH_CONFIGS["down"])
