"""Reference attention for the eager (CPU / parity) path: GQA, causal + padding mask, contiguous KV cache.

The math is written out as matmul -> additive mask -> fp32 softmax -> matmul, the same operations in the
same order as Hugging Face's "eager" attention, so fp32 CPU results can be compared bit for bit with the
official model. Fast GPU paths (paged KV, fused kernels, CUDA graphs) live elsewhere and are held against
this one.

Cache layout: one `LayerKVCache` per decoder layer holding keys/values [B, Hkv, T, D] for all T tokens seen
so far (prompt padding included). The cache is passed explicitly through every forward call; the modules
keep no state between calls, so one model can serve any number of independent sequences.
"""
from __future__ import annotations

import torch


class LayerKVCache:
    """Keys and values of one attention layer, grown by concatenation (simple, not fast)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' k/v [B, Hkv, S, D]; return all keys/values so far."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=-2)
            self.v = torch.cat((self.v, v), dim=-2)
        return self.k, self.v

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.k is not None:
            self.k = self.k.index_select(0, rows)
            self.v = self.v.index_select(0, rows)


class KVCache:
    """The per-layer caches of one decoder stack for one batch of sequences."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerKVCache() for _ in range(num_layers)]

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def seq_len(self) -> int:
        """Tokens already cached (all layers hold the same number)."""
        return self.layers[0].seq_len if self.layers else 0

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` (e.g. drop finished sequences), in that order."""
        for layer in self.layers:
            layer.select_rows(rows)


def attention_bias(num_queries: int, num_keys: int, key_valid: torch.Tensor | None, *, batch: int,
                   dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """Additive mask [B, 1, S, T] for S new queries that are the last S of T cached positions.

    Query i may see key j when j <= T - S + i (causal by cache slot) and key j is not padding.
    Blocked entries get the dtype's most negative finite value rather than -inf: a query that sees
    nothing (a left-padding slot) then gets a uniform softmax instead of NaN, and since blocked weights
    are exactly 0 such rows never leak into real ones. Returns None when nothing is blocked.
    """
    if key_valid is None and num_queries == 1:
        return None
    q_slot = torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]
    k_slot = torch.arange(num_keys, device=device)[None, :]
    allowed = (k_slot <= q_slot)[None, None]  # [1, 1, S, T]
    if key_valid is not None:
        if key_valid.shape != (batch, num_keys):
            raise ValueError(f"attention mask has shape {tuple(key_valid.shape)}, expected {(batch, num_keys)}")
        allowed = allowed & key_valid.to(torch.bool)[:, None, None, :]
    allowed = allowed.expand(batch, 1, num_queries, num_keys)
    zero = torch.zeros((), dtype=dtype, device=device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, zero, blocked)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, Hkv * groups, T, D]; query head h reads kv head h // groups."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                    scale: float) -> torch.Tensor:
    """q [B, Hq, S, D], k/v [B, Hkv, T, D], bias [B, 1, S, T] or None -> [B, S, Hq, D]."""
    groups = q.shape[1] // k.shape[1]
    k = repeat_kv(k, groups)
    v = repeat_kv(v, groups)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v).transpose(1, 2).contiguous()
