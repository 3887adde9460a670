"""A preallocated KV cache for short, fixed-length decodes (the code predictor: 16 positions per frame).

`KVCache` (attention.py) grows by concatenation: two copy kernels per layer and step, and a new allocation each
time. Here each layer owns [B, Hkv, max_len, D] buffers from the start and a Python-int length (the code predictor's
steps are unrolled, so every step's position is known on the host and a CUDA graph captures fixed offsets).

The cache attends itself (`attend`, the hook Qwen3Attention calls when a cache has one): on the kernel path a
single-token step is one fused kernel that attends over the cached positions plus the new token and writes the
new key/value into the buffers (voxflow/kernels/dense_decode_attention.py); otherwise (a multi-token step, a
mask, CPU) the new keys/values are copied in and eager attention runs over the filled prefix — the same values
`KVCache.append` + eager attention would see.
"""
from __future__ import annotations

import torch

from voxflow.kernels import use_kernels
from voxflow.layers.attention import KVCache, eager_attention


class StaticLayerKVCache:
    def __init__(self, batch: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, k: torch.Tensor | None = None, v: torch.Tensor | None = None):
        """k / v: the [B, Hkv, max_len, D] buffers to use (views of a stack's shared buffers), else allocated."""
        self.k = k if k is not None else torch.empty(batch, num_kv_heads, max_len, head_dim, dtype=dtype,
                                                     device=device)
        self.v = v if v is not None else torch.empty_like(self.k)
        self.length = 0

    @property
    def seq_len(self) -> int:
        return self.length

    def claim(self, n: int = 1) -> int:
        """The next n positions' first, for a kernel that writes those tokens' keys/values there itself (the code
        predictor's fused layer step, voxflow/kernels/cp_layer.py); the cache counts them as filled from now on."""
        if self.length + n > self.k.shape[2]:
            raise ValueError(f"static KV cache of {self.k.shape[2]} positions has no room for {n} more")
        start, self.length = self.length, self.length + n
        return start

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               scale: float) -> torch.Tensor:
        """q [B, Hq, S, D], new k/v [B, Hkv, S, D] -> [B, S, Hq, D]; the new keys/values are kept."""
        s, start = k.shape[2], self.length
        if start + s > self.k.shape[2]:
            raise ValueError(f"static KV cache of {self.k.shape[2]} positions cannot take {start + s}")
        self.length = start + s
        if bias is None and s == 1 and use_kernels(q):
            from voxflow.kernels import dense_decode_attention as dense
            if dense.supported(q, k):
                return dense.dense_decode_attention_append(q, k, v, self.k, self.v, start, scale)
        self.k[:, :, start:start + s] = k
        self.v[:, :, start:start + s] = v
        return eager_attention(q, self.k[:, :, :start + s], self.v[:, :, :start + s], bias, scale)

    def attend_raw(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm, k_norm, cos: torch.Tensor,
                   sin: torch.Tensor, scale: float, folded_norm: tuple[torch.Tensor, float] | None = None
                   ) -> torch.Tensor | None:
        """A step of S new tokens from the raw projections (q [B, S, Hq, D], k / v [B, S, Hkv, D], per-head views;
        S = 1 a decode step, more the causal S-token step): q/k norms, RoPE, append and attention in one kernel
        (voxflow/kernels/dense_decode_norm_rope.py) -> [B, S, Hq, D]. folded_norm (the layer input rows [B * S, H],
        eps): the projections came through a weight with the input RMSNorm folded in
        (voxflow/layers/folded_norms.py); the kernel applies the rows' factors. None when that kernel does not
        apply (nothing done: the caller then takes the usual path)."""
        from voxflow.kernels import dense_decode_norm_rope as fused
        s = q.shape[1]
        if (not fused.supported(q, k, v, q_norm.weight, k_norm.weight, cos, sin)
                or self.length + s > self.k.shape[2]):
            return None
        if folded_norm is not None and not fused.supported_folded(folded_norm[0], q):
            return None
        start = self.claim(s)
        return fused.norm_rope_attend_append(q, k, v, q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps, cos,
                                             sin, self.k, self.v, start, scale, folded_norm=folded_norm)


class StaticKVCache(KVCache):
    """One StaticLayerKVCache per decoder layer (indexing, len and seq_len as KVCache). The layers' buffers are
    views of one [L, B, Hkv, max_len, D] tensor each for keys and values (`k_all` / `v_all`): two allocations a
    frame, not two a layer."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.k_all = torch.empty(num_layers, batch, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v_all = torch.empty_like(self.k_all)
        self.layers = [StaticLayerKVCache(batch, num_kv_heads, max_len, head_dim, dtype, device, self.k_all[i],
                                          self.v_all[i]) for i in range(num_layers)]
