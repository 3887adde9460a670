"""A paged KV cache seen through the decoder stack's cache interface: plain torch indexing (the reference), and
on the GPU the fused paged-attention kernels: single-token decode (voxflow.kernels.paged_decode_attention) and the
packed prefill's query tiles (voxflow.kernels.paged_prefill_attention).

The stack (`Qwen3DecoderStack.forward`) asks its cache for `seq_len` (keys already cached) and builds an additive
mask from `attention_mask [B, T]` over all T key slots, the queries being the last S of them. Per layer i,
`Qwen3Attention` calls `cache[i].attend(q, k, v, bias, scale)` (caches without `attend`, like the eager
`LayerKVCache`, get `append` + `eager_attention` instead). `PagedKVView` satisfies that without touching the stack:

- `attend` writes the new tokens' k/v [B, Hkv, S, D] into the layer's pages at `slot_mapping`, then
  - decode (S == 1) with kernels on (`use_kernels(q)`: CUDA tensor, Triton, switch on): the kernel writes the new
    token into its slot and reads each row's pages in place up to context_lens[b]. `bias` is not read: for one
    query it only says "the row's last context_lens[b] slots", which is exactly what the kernel attends to;
  - a packed prefill (`PagedKVContext.rows_share_sequences`, one token a row, rows reading each other's new K/V)
    with kernels on: every row written first, then the tiled prefill kernel over its query tiles
    (voxflow.kernels.paged_prefill_attention);
  - otherwise the reference: `append` (below) and `eager_attention` with the given bias;
- `append` writes, then gathers each row's whole context through its block table, RIGHT-aligned into
  [B, Hkv, T, D]: row b's tokens fill the last context_lens[b] key slots (its new tokens are the very last S),
  the slots before them are left padding;
- `key_valid [B, T]` marks the real slots, to be passed as the stack's `attention_mask`;
- `seq_len = T - S`.

T = block_tables.shape[1] * block_size, a host-side number: no device->host sync and a static shape for a
given table width (the engine chooses the width; the narrower, the less work). Both paths are CUDA-graph
capturable. Padding slots gather the row's first token (always written) rather than arbitrary pool memory, so
uninitialised pages (NaN/inf) never reach the attention matmul, where even a zero weight times NaN would poison
the row. The gather indices are computed on first use only: the kernel path never needs them.
"""
from __future__ import annotations

import functools

import torch

from voxflow.engine.model_api import PagedKVContext
from voxflow.kernels import FP8_KV, as_stored, use_kernels
from voxflow.layers.attention import eager_attention


FP8_MAX = float(torch.finfo(FP8_KV).max)       # 448


class PagedLayerView:
    """Layer i of a `PagedKVView` (what `cache[i]` returns)."""

    def __init__(self, parent: "PagedKVView", layer: int):
        self.parent = parent
        self.layer = layer

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new k/v [B, Hkv, S, D]; return every row's context [B, Hkv, T, D] (right-aligned)."""
        p = self.parent
        return p.write_and_gather(p.kv.k_cache[self.layer], k), p.write_and_gather(p.kv.v_cache[self.layer], v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               scale: float) -> torch.Tensor:
        """q [B, Hq, S, D], new k/v [B, Hkv, S, D], bias [B, 1, S, T] -> attention output [B, S, Hq, D]."""
        p = self.parent
        if q.shape[2] == 1 and use_kernels(q) and p.kv.prefill_tiles is not None:
            # A packed prefill (rows_share_sequences): rows read K/V that other rows write, so all are written
            # first; then each query tile of a chunk reads its context once (not once a row).
            from voxflow.kernels.paged_prefill_attention import paged_prefill_attention
            k_pool, v_pool = p.kv.k_cache[self.layer], p.kv.v_cache[self.layer]
            p.write(k_pool, k, kernel=True)
            p.write(v_pool, v, kernel=True)
            chunk_tables, tiles = p.kv.prefill_tiles
            return paged_prefill_attention(q[:, :, 0], k_pool, v_pool, chunk_tables, tiles, scale)[:, None]
        if q.shape[2] == 1 and use_kernels(q) and not p.kv.rows_share_sequences:
            # Imported here: the module decorates Triton kernels, which the CPU path never needs.
            from voxflow.kernels.paged_decode_attention import paged_decode_attention
            k_pool, v_pool = p.kv.k_cache[self.layer], p.kv.v_cache[self.layer]
            tables = p.kv.block_tables.to(q.device)          # no-ops (no copy, no sync) when already there
            lens = p.kv.context_lens.to(q.device)
            # The kernel writes the new token's k/v into its slot itself (no separate scatter launches), rounding
            # it to an fp8 pool's dtype itself (no cast launches).
            out = paged_decode_attention(q[:, :, 0], k_pool, v_pool, tables, lens, scale,
                                         k_new=k[:, :, 0], v_new=v[:, :, 0], slots=p.write_index)
            return out[:, None]
        # The reference (and rows sharing sequences without tiles): `append` writes every row before gathering.
        keys, values = self.append(k, v)
        return eager_attention(q, keys, values, bias, scale)


class PagedKVView:
    def __init__(self, kv: PagedKVContext, num_new: int):
        self.kv = kv
        self.num_new = num_new
        tables = kv.block_tables
        batch, width = tables.shape
        if kv.slot_mapping.shape != (batch, num_new):
            raise ValueError(f"slot_mapping has shape {tuple(kv.slot_mapping.shape)}, expected {(batch, num_new)}")
        self.num_keys = width * kv.block_size
        # contiguous: the row scatter kernel (write(kernel=True)) reads it with a unit stride
        self.write_index = kv.slot_mapping.to(device=tables.device, dtype=torch.long).reshape(-1).contiguous()

    @functools.cached_property
    def _token(self) -> torch.Tensor:
        """[B, T]: key slot t of row b holds token j = t - (T - len_b); j < 0 is left padding."""
        device = self.kv.block_tables.device
        return (torch.arange(self.num_keys, device=device)[None, :]
                - (self.num_keys - self.kv.context_lens.to(device=device, dtype=torch.long))[:, None])

    @functools.cached_property
    def key_valid(self) -> torch.Tensor:
        """[B, T] real key slots (the stack's attention_mask for the reference path)."""
        return self._token >= 0

    def attention_mask(self, like: torch.Tensor) -> torch.Tensor | None:
        """What to pass the stack as `attention_mask`: None when every layer takes the decode kernel (one new token,
        kernels on for tensors like `like`), which reads each row's own length and needs no mask -- so no mask is
        built at all; else `key_valid`."""
        if self.num_new == 1 and use_kernels(like):
            return None
        return self.key_valid

    @functools.cached_property
    def gather_index(self) -> torch.Tensor:
        """[B, T] flat pool slot of every key slot (reference path only; computed once, on first use)."""
        bs = self.kv.block_size
        token = self._token.clamp_min(0)            # padding reads token 0 of its own row (always written)
        block = self.kv.block_tables.to(torch.long).gather(1, token // bs)
        return block * bs + token % bs

    @property
    def seq_len(self) -> int:
        return self.num_keys - self.num_new

    def __getitem__(self, layer: int) -> PagedLayerView:
        return PagedLayerView(self, layer)

    def __len__(self) -> int:
        return len(self.kv.k_cache)

    def write(self, pool: torch.Tensor, new: torch.Tensor, kernel: bool = False) -> None:
        """Store new [B, Hkv, S, D] into pool [blocks, block_size, Hkv, D] at the new tokens' slots (in place).
        kernel: by the Triton row scatter (kernels/row_copy.py) instead of an index_put -- the same copy; a packed
        prefill's index_puts ran at ~0.2 TB/s, 3.3 ms of a 0.6B wave's ~68 ms of kernels (session 52 call 1)."""
        b, hkv, s, d = new.shape
        rows = new.transpose(1, 2).reshape(b * s, hkv, d)
        if pool.dtype == FP8_KV:                    # saturate: a torch whose cast turns |x| > 448 into NaN would
            rows = rows.clamp(-FP8_MAX, FP8_MAX)    # otherwise poison every later step reading that page
        rows = as_stored(rows.to(pool.dtype))
        if kernel:
            from voxflow.kernels.row_copy import scatter_rows
            scatter_rows(as_stored(pool).view(-1, hkv * d), self.write_index, rows.reshape(b * s, hkv * d))
        else:
            as_stored(pool).view(-1, hkv, d)[self.write_index] = rows

    def write_and_gather(self, pool: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """pool [blocks, block_size, Hkv, D] (written in place), new [B, Hkv, S, D] -> context [B, Hkv, T, D] in new's
        dtype (an fp8 pool's values widened: the attention math never runs in the pool's storage dtype)."""
        self.write(pool, new)
        context = as_stored(pool).view(-1, new.shape[1], new.shape[3])[self.gather_index].view(pool.dtype)
        return context.permute(0, 2, 1, 3).to(new.dtype)
