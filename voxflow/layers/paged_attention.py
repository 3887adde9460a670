"""A paged KV cache seen through the decoder stack's cache interface (plain torch indexing; the reference that
a fused paged-attention kernel will be held against).

The stack (`Qwen3DecoderStack.forward`) asks its cache for `seq_len` (keys already cached) and, per layer i,
calls `cache[i].append(k, v) -> (all_k, all_v)`, then attends with an additive mask built from
`attention_mask [B, T]` over all T key slots, the queries being the last S of them. `PagedKVView` satisfies that
without touching the stack:

- `append` writes the new tokens' k/v [B, Hkv, S, D] into the layer's pages at `slot_mapping`, then gathers
  each row's whole context through its block table, RIGHT-aligned into [B, Hkv, T, D]: row b's tokens fill the
  last context_lens[b] key slots (its new tokens are the very last S), the slots before them are left padding;
- `key_valid [B, T]` marks the real slots, to be passed as the stack's `attention_mask`;
- `seq_len = T - S`.

T = block_tables.shape[1] * block_size, a host-side number: no device->host sync and a static shape for a
given table width (the engine chooses the width; the narrower, the less work). Padding slots gather the row's
first token (always written) rather than arbitrary pool memory, so uninitialised pages (NaN/inf) never reach
the attention matmul, where even a zero weight times NaN would poison the row.
"""
from __future__ import annotations

import torch

from voxflow.engine.model_api import PagedKVContext


class PagedLayerView:
    """Layer i of a `PagedKVView` (what `cache[i]` returns)."""

    def __init__(self, parent: "PagedKVView", layer: int):
        self.parent = parent
        self.layer = layer

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.parent
        return p.write_and_gather(p.kv.k_cache[self.layer], k), p.write_and_gather(p.kv.v_cache[self.layer], v)


class PagedKVView:
    def __init__(self, kv: PagedKVContext, num_new: int):
        self.kv = kv
        self.num_new = num_new
        tables = kv.block_tables
        batch, width = tables.shape
        if kv.slot_mapping.shape != (batch, num_new):
            raise ValueError(f"slot_mapping has shape {tuple(kv.slot_mapping.shape)}, expected {(batch, num_new)}")
        bs = kv.block_size
        self.num_keys = width * bs
        device = tables.device
        lens = kv.context_lens.to(device=device, dtype=torch.long)
        # Key slot t of row b holds token j = t - (T - len_b); j < 0 is left padding.
        token = torch.arange(self.num_keys, device=device)[None, :] - (self.num_keys - lens)[:, None]
        self.key_valid = token >= 0                                          # [B, T]
        token = token.clamp_min(0)                  # padding reads token 0 of its own row (always written)
        block = tables.to(torch.long).gather(1, token // bs)
        self.gather_index = block * bs + token % bs                          # [B, T] flat slots
        self.write_index = kv.slot_mapping.to(device=device, dtype=torch.long).reshape(-1)

    @property
    def seq_len(self) -> int:
        return self.num_keys - self.num_new

    def __getitem__(self, layer: int) -> PagedLayerView:
        return PagedLayerView(self, layer)

    def __len__(self) -> int:
        return len(self.kv.k_cache)

    def write_and_gather(self, pool: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """pool [blocks, block_size, Hkv, D] (written in place), new [B, Hkv, S, D] -> context [B, Hkv, T, D]."""
        b, hkv, s, d = new.shape
        flat = pool.view(-1, hkv, d)
        flat[self.write_index] = new.transpose(1, 2).reshape(b * s, hkv, d).to(pool.dtype)
        return flat[self.gather_index].permute(0, 2, 1, 3)
