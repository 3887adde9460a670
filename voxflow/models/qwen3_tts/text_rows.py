"""Projected text embeddings kept per token id: a prompt build gathers rows instead of running the projection.

A text token's prompt vector is text_projection(text_embedding(id)): a two-layer MLP (2048 -> 2048 -> H) applied
row by row, so it depends on the id alone. Run per request it was the largest part of a prompt build in the
serving engine (session 8 H200 profile: 86 of 210 ms over 72 builds went to its two Linear calls, 0.47 ms each,
while a wave of new requests waited for their prefill). Here each id is projected once — the ids a call needs
and lacks, in one projection — and kept in a device table; a call is one index upload and one gather (a build
makes one to three: instruction, text, and the fixed rows when its language / speaker is new).

The cached row is the same MLP on the same weights, computed in a batch of other ids instead of the request's
own: equal up to the GEMM's summation order for that batch size (tests/test_text_rows.py bounds it). Weights that
change (load, cast, in-place edit: `Talker.weights_version`) empty the table. (A prefix-cache hit may then reuse
K/V computed from rows of the previous table: equal up to that same rounding.) It holds at most `max_rows` ids
(the Qwen vocabulary is 151,936 rows, 622 MB at H=2048 in bf16) and starts over when full, which a server meets
only with a very diverse text stream; a reset costs one projection call per id again.

`preload=True` (the serving engine's default on a GPU: EngineConfig.preload_text_rows) keeps every id instead: the
whole vocabulary is projected when the table is made (and again after a weight change), in chunks of
PRELOAD_CHUNK ids, into one table allocated once (vocab x H: 622 MB for the 1.7B, 311 MB for the 0.6B in bf16), so
no prompt build ever runs the projection. Why: a first sight of a text's ids costs its build a projection call
(H200 session 25 call 1, 1.7B: 1.15 ms a build on first sight against 0.69 on second, 0.42 ms a projection call),
and a fresh server's first users pay it in a wave of prompt builds (session 24 call 6: prepare 22-44 ms per wave of
16 on first sight against 10-11 on second). Measured with it (session 25 call 3, HTTP c=16 on a fresh 1.7B server,
its first run): intake + prepare 16.5 -> 6.9 ms a request, TTFP p50 73 -> 60 ms, p99 78 -> 75.
"""
from __future__ import annotations

import numpy as np
import torch

from ...engine.host_to_device import to_device

DEFAULT_MAX_ROWS = 32768          # 128 MiB at H=2048 in bf16
_FIRST_ROWS = 1024
# Ids a preload projects at a time. Its transients at H=2048 in bf16: the gathered rows, the MLP's hidden and
# activated rows and its output, 32 MiB each (~130 MB on the device at the peak), and the rows' pinned host copy.
PRELOAD_CHUNK = 8192
_NONE = np.empty(0, dtype=np.int64)         # the ids a preloaded table lacks


class ProjectedTextRows:
    def __init__(self, talker, max_rows: int = DEFAULT_MAX_ROWS, preload: bool = False):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.talker = talker
        self.vocab = talker.model.text_embedding.num_embeddings
        self.preload = preload
        self.max_rows = self.vocab if preload else max_rows
        self.projected = 0                 # ids projected so far (a test reads it: cache hits project none)
        self._reset(talker.weights_version() if preload else None)

    def _reset(self, version) -> None:
        self._version = version
        self._slot = np.full(self.vocab, -1, dtype=np.int64)     # id -> row of the table, -1: not kept
        self._table: torch.Tensor | None = None
        self._used = 0
        if self.preload:
            self._table = torch.empty((self.vocab, self.talker.cfg.hidden_size), device=self.talker.device,
                                      dtype=self.talker.text_projection.linear_fc2.weight.dtype)
            for start in range(0, self.vocab, PRELOAD_CHUNK):
                self._add(np.arange(start, min(start + PRELOAD_CHUNK, self.vocab), dtype=np.int64))

    def warm(self, count: int) -> int:
        """Project the first `count` token ids now (those not kept yet), in chunks of PRELOAD_CHUNK: a BPE
        vocabulary numbers its merges by frequency, so the low ids are most of any text's tokens, and a fresh
        server's first prompts then mostly find their rows (without it a first wave of 54 arrivals took 43.8 ms of
        prompt builds against ~12 ms once their ids were kept: H100 session 46, 0.6B over HTTP). At most half the
        rows it keeps, so that other ids have room before a full table starts over. Returns the ids projected."""
        if self.preload:
            return 0                        # every id is kept already
        if not 0 <= count <= self.max_rows // 2:
            raise ValueError(f"can warm 0 .. {self.max_rows // 2} ids (half of the {self.max_rows} kept), got {count}")
        count = min(count, self.vocab)
        before = self.projected
        for start in range(0, count, PRELOAD_CHUNK):
            ids = np.arange(start, min(start + PRELOAD_CHUNK, count), dtype=np.int64)
            self.rows(ids)                  # (the ids already kept project nothing)
        return self.projected - before

    @property
    def table_bytes(self) -> int:
        """Device bytes the table holds now."""
        return 0 if self._table is None else self._table.numel() * self._table.element_size()

    def rows(self, ids) -> torch.Tensor:
        """[len(ids), H] projected text embeddings of these token ids, on the talker's device and dtype."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise ValueError(f"text token id out of range [0, {self.vocab})")
        version = self.talker.weights_version()
        if version != self._version:
            self._reset(version)
        missing = _NONE if self.preload else np.unique(ids[self._slot[ids] < 0])     # preloaded: every id kept
        if ids.size == 0 or (ids.size > self.max_rows and np.unique(ids).size > self.max_rows):  # more than it keeps
            with torch.no_grad():
                return self.talker.embed_text(self._ids_for_table(ids))
        if missing.size and self._used + missing.size > self.max_rows:
            self._reset(version)
            missing = np.unique(ids)
        if missing.size:
            self._add(missing)
        return self._table.index_select(0, to_device(torch.from_numpy(self._slot[ids]), self._table.device))

    def _ids_for_table(self, ids: np.ndarray) -> torch.Tensor:
        """Host ids as a tensor where the embedding table lives (in host memory: no copy to the device and back)."""
        return to_device(torch.from_numpy(ids), self.talker.model.text_embedding.weight.device)

    def _add(self, new_ids: np.ndarray) -> None:
        device = self.talker.device
        with torch.no_grad():
            projected = self.talker.embed_text(self._ids_for_table(new_ids))
        end = self._used + new_ids.size
        if self._table is None or end > self._table.shape[0]:
            size = min(self.max_rows, max(_FIRST_ROWS, 2 * end))
            grown = torch.empty((size, projected.shape[-1]), dtype=projected.dtype, device=device)
            if self._table is not None:
                grown[: self._used] = self._table[: self._used]
            self._table = grown
        self._table[self._used: end] = projected
        self._slot[new_ids] = np.arange(self._used, end)
        self._used = end
        self.projected += new_ids.size
