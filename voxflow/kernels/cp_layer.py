"""One code-predictor decoder layer for a decode step (one token per row, a few rows) in four kernels:

    K1 norm_linear.py        qkv = rms_norm(x, input_layernorm) @ W_qkv^T           (the norm rides in the GEMM)
    K2 attention_o_proj.py   h   = x + o_proj(attention(q/k norm + RoPE, cache + new k/v))   (+ the cache append)
    K3 norm_linear.py        act = silu(gate) * up of rms_norm(h, post_attention_layernorm) @ W_gate|up^T
    K4 skinny_linear.py      out = h + act @ W_down^T                                (written over h)

instead of seven (norm, cuBLAS q|k|v, norm/RoPE/attention, skinny o_proj, norm, cuBLAS gate|up, skinny down_proj
with silu * up in its prologue: ~30 us per layer step on an H200 at batch 1 for ~9 us of weight reads).

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
from voxflow.kernels import norm_linear as nl
from voxflow.kernels import skinny_linear as sk

MAX_M = min(nl.MAX_M, attn.MAX_M)

# Launch-config overrides per kernel (None: each module's launch_config), e.g. from benchmarks/scripts/
# tune_cp_layer.py's table; "lm_head": the code predictor's norm + lm_head through norm_linear (when it is on).
# (down: skinny_linear's one-row heuristic now picks the 4 columns a program this table once set; the engine runs the
# fused layers at one row only, CP_FUSED_MAX_ROWS.)
CONFIGS: dict[str, dict | None] = {"qkv": None, "attention_o_proj": None, "gate_up": None, "down": None,
                                   "lm_head": None}


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
              v_cache: torch.Tensor, joint: bool = False) -> bool:
    """Whether `layer_step` runs for rows x [M, H] (checked before any launch; joint: as `layer_step`'s)."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        return False
    inter = w.gate_up.shape[0] // 2
    down = w.down       # K4 reads act [M, inter], contiguous, made by K3 (skinny_linear's own size rules)
    down_ok = (down.shape == (x.shape[1], inter) and down.dtype == x.dtype and down.device == x.device
               and down.is_contiguous() and inter % 16 == 0 and down.numel() < 2 ** 31)
    return (down_ok and nl.supported(x, w.qkv, w.input_norm)
            and attn.supported(None, x, w.o, w.q_norm, w.k_norm, cos, sin, k_cache, v_cache, w.num_heads,
                               qkv_width=w.qkv.shape[0], joint=joint)
            and nl.supported(x, w.gate_up, w.post_norm, swiglu=True))


def layer_step(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, length: int, joint: bool = False) -> torch.Tensor:
    """The layer on rows x [M, H] (one new token each, at cache position `length`; row b's cache is
    k_cache[b] / v_cache[b], updated in place) -> new rows [M, H] (x itself is left unchanged).
    joint: x's two rows are consecutive tokens of cache row 0 at positions `length` and `length` + 1 (cos / sin
    one row each), the second attending to the first (attention_o_proj's joint form): a 2-token causal step of one
    sequence with each weight streamed once."""
    qkv = nl.norm_linear(x, w.qkv, w.input_norm, w.input_eps, config=CONFIGS["qkv"])
    h = attn.attention_o_proj(qkv, x, w.o, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, k_cache, v_cache, length,
                              w.num_heads, w.scale, config=CONFIGS["attention_o_proj"], joint=joint)
    act = nl.norm_linear(h, w.gate_up, w.post_norm, w.post_eps, swiglu=True, config=CONFIGS["gate_up"])
    return sk.skinny_linear(act, w.down, residual=h, out=h, config=CONFIGS["down"])


def layer_append(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, length: int) -> None:
    """K1 and K2 of `layer_step` only: the rows' keys / values appended at `length`, for a token whose output no
    later layer reads (the last layer's for every position of a prefill but the last). The same cache bits."""
    qkv = nl.norm_linear(x, w.qkv, w.input_norm, w.input_eps, config=CONFIGS["qkv"])
    attn.attention_o_proj(qkv, x, w.o, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, k_cache, v_cache, length,
                          w.num_heads, w.scale, config=CONFIGS["attention_o_proj"])
