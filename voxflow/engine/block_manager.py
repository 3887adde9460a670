"""Paged KV cache bookkeeping: a fixed pool of blocks, reference counts, and prefix caching.

Every block is in exactly one of three states:
  held       ref_count > 0: in the block table of that many live sequences;
  cached     ref_count == 0 but its hash is published: its KV is still valid and a later prompt with the same
             key prefix can reuse it; evicted least-recently-freed first when fresh blocks run out;
  free       ref_count == 0, no hash.
Cached and free blocks both count as free capacity.

Prefix caching: a FULL block of prompt positions gets hash = H(parent block's hash, the block's position keys),
so equal hashes mean equal key prefixes up to the block's end (and hence equal KV). A block's hash is published
when `mark_computed` covers its last position. Positions past the prompt (fed-back frames) have no shareable
keys and are never cached.

Ordering rule for the engine: a block is published when the chunk that computes it is *scheduled*, so a later
chunk of the same step may already reuse it. The engine must therefore execute a step's prefill chunks in the
order given (or write every chunk's KV of a layer before attending), and apply aborts between steps, never
between `schedule()` and running what it returned.

All per-step operations are O(blocks touched); only `check_invariants` walks the pool.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Iterable

from .sequence import Sequence

if TYPE_CHECKING:
    from .model_api import KVSpec


def num_blocks_for(memory_bytes: int, kv_spec: "KVSpec", block_size: int) -> int:
    """How many blocks of `block_size` positions fit in `memory_bytes` of KV cache (all layers, K and V)."""
    return max(0, int(memory_bytes) // (kv_spec.bytes_per_token * block_size))


DEFAULT_POSITIONS_PER_SEQ = 4096      # ~5 min of audio at 12.5 frames/s, plus its prompt
DEFAULT_KV_FREE_FRACTION = 0.4        # of the GPU memory free after the weights: the rest is for the codec's
                                      # activations (they grow with the batch), graphs and the allocator's slack


def default_kv_bytes(bytes_per_token: int, max_num_seqs: int, free_bytes: int | None) -> int:
    """The KV pool's size when the operator gave none: room for every slot to hold DEFAULT_POSITIONS_PER_SEQ, but on a
    GPU at most DEFAULT_KV_FREE_FRACTION of its free memory (at 256 slots the first rule alone asks 120 GB for the
    1.7B talker, and the codec then runs out of memory; the scheduler preempts when a smaller pool fills up)."""
    want = bytes_per_token * max_num_seqs * DEFAULT_POSITIONS_PER_SEQ
    if free_bytes is None:
        return want
    return min(want, int(free_bytes * DEFAULT_KV_FREE_FRACTION))


def blocks_for(num_positions: int, block_size: int) -> int:
    return -(-num_positions // block_size)


def chain_hash(parent: bytes | None, keys: Iterable[int]) -> bytes:
    """Hash of a full block given its parent's hash. 128-bit so collisions (= silently wrong KV) are negligible;
    repr() keeps the encoding unambiguous whatever the size or sign of the keys."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(repr(tuple(keys)).encode())
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))   # stack; pops block 0 first
        self._cached: OrderedDict[int, None] = OrderedDict()          # ref 0 + hash; oldest-freed first
        self._hash_to_block: dict[bytes, int] = {}
        self._holders: set[Sequence] = set()                          # sequences holding blocks
        self._num_held = 0

    # ---- capacity ---------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take (free + cached-but-unreferenced)."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        """Fraction of the pool held by live sequences (cached blocks count as free)."""
        return self._num_held / self.num_blocks

    def max_positions(self) -> int:
        return self.num_blocks * self.block_size

    # ---- admission --------------------------------------------------------------------------------------
    def _prompt_hashes(self, seq: Sequence) -> list[bytes]:
        """Hashes of the sequence's full prompt blocks (computed once per sequence)."""
        n_full = seq.prompt_len // self.block_size
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < n_full:
            i = len(hashes)
            hashes.append(chain_hash(hashes[i - 1] if i else None, seq.position_keys[i * bs:(i + 1) * bs]))
        return hashes

    def _cache_hits(self, seq: Sequence) -> list[int]:
        """Blocks of the longest cached chain of the sequence's prompt, leaving its last position uncached
        (the model must compute at least one position to sample from it)."""
        limit = min(seq.prompt_len, seq.num_prefill_target - 1) // self.block_size
        hits = []
        for h in self._prompt_hashes(seq)[:limit]:
            block_id = self._hash_to_block.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocation_cost(self, seq: Sequence) -> int:
        """Free capacity (`num_free_blocks`) that allocating the sequence's prefill target would take."""
        hits = self._cache_hits(seq)
        fresh = blocks_for(seq.num_prefill_target, self.block_size) - len(hits)
        # A hit on an unreferenced cached block takes it out of the free capacity too.
        hits_from_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return fresh + hits_from_free

    def can_allocate(self, seq: Sequence) -> bool:
        return self.allocation_cost(seq) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> int:
        """Blocks for the sequence's whole prefill target, reusing cached prefix blocks. Sets `num_computed`
        (and `num_cached`) to the reused positions and returns that number."""
        assert not seq.block_table and seq not in self._holders, f"{seq} already holds blocks"
        if not self.can_allocate(seq):
            raise RuntimeError(f"cannot allocate {seq}: {self.num_free_blocks} free blocks")
        hits = self._cache_hits(seq)
        for block_id in hits:
            self._ref(block_id)
        table = hits + [self._take_fresh() for _ in
                        range(blocks_for(seq.num_prefill_target, self.block_size) - len(hits))]
        seq.block_table = table
        self._holders.add(seq)
        seq.num_cached = seq.num_computed = len(hits) * self.block_size
        return seq.num_cached

    # ---- growth -----------------------------------------------------------------------------------------
    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq.block_table) * self.block_size <= seq.num_computed

    def can_append(self, seqs: Iterable[Sequence]) -> bool:
        """Room for one more position in each of `seqs`."""
        return sum(1 for s in seqs if self._needs_block(s)) <= self.num_free_blocks

    def append_slot(self, seq: Sequence) -> None:
        """Room for position `seq.num_computed` (a new block when it starts one)."""
        assert seq in self._holders, f"{seq} holds no blocks"
        if self._needs_block(seq):
            if self.num_free_blocks == 0:
                raise RuntimeError(f"no free block to append to {seq}")
            seq.block_table.append(self._take_fresh())

    def mark_computed(self, seq: Sequence, num_computed: int) -> None:
        """Positions [0, num_computed) now have KV (see the ordering rule above): publish the hashes of prompt
        blocks that this completed."""
        assert seq.num_computed <= num_computed <= len(seq.block_table) * self.block_size, (seq, num_computed)
        bs = self.block_size
        first, end = seq.num_computed // bs, min(num_computed, seq.prompt_len) // bs
        if first < end:
            hashes = self._prompt_hashes(seq)
            for i in range(first, end):
                block = self.blocks[seq.block_table[i]]
                if block.hash is None and hashes[i] not in self._hash_to_block:
                    block.hash = hashes[i]
                    self._hash_to_block[block.hash] = block.block_id
                # else: a reused block (already published) or a twin computed concurrently by another
                # sequence; the twin stays unpublished and returns to the plain free list.
        seq.num_computed = num_computed

    # ---- release ----------------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Give back the sequence's blocks; published ones stay cached. Frees the tail first so that LRU
        eviction takes a chain's tail before its head (a head evicted first would strand its tail)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._num_held -= 1
                if block.hash is not None:
                    self._cached[block_id] = None
                else:
                    self._free.append(block_id)
        seq.block_table = []
        seq.num_computed = 0
        self._holders.discard(seq)

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat cache slot (block * block_size + offset) of each position in [start, end)."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- internals --------------------------------------------------------------------------------------
    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._cached.pop(block_id)
            self._num_held += 1
        block.ref_count += 1

    def _take_fresh(self) -> int:
        """A block for new content: a plain free one, else evict the least recently freed cached block."""
        if self._free:
            block_id = self._free.pop()
        else:
            block_id, _ = self._cached.popitem(last=False)
            block = self.blocks[block_id]
            del self._hash_to_block[block.hash]
            block.hash = None
        self.blocks[block_id].ref_count = 1
        self._num_held += 1
        return block_id

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (O(pool); for tests and debugging)."""
        holders: dict[int, int] = {}
        for seq in self._holders:
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq} holds a block twice"
            assert len(seq.block_table) * self.block_size >= seq.num_computed, seq
            for b in seq.block_table:
                holders[b] = holders.get(b, 0) + 1
        free, cached = set(self._free), set(self._cached)
        assert len(free) == len(self._free), "a block is twice in the free list"
        assert not free & cached, "a block is both free and cached"
        for block in self.blocks:
            b = block.block_id
            assert block.ref_count == holders.get(b, 0), f"block {b}: ref {block.ref_count} != {holders.get(b, 0)}"
            assert block.ref_count >= 0
            if block.ref_count > 0:
                assert b not in free and b not in cached, f"block {b} is held and free"
            else:
                assert (b in free) != (b in cached), f"block {b} is unheld but neither free nor cached (or both)"
                assert (block.hash is not None) == (b in cached), f"block {b}: cached <=> published"
            if block.hash is not None:
                assert self._hash_to_block.get(block.hash) == b, f"block {b}: hash table does not point back"
        for h, b in self._hash_to_block.items():
            assert self.blocks[b].hash == h, f"hash table entry for block {b} is stale"
        assert self._num_held == len(holders)
        assert len(free) + len(cached) + self._num_held == self.num_blocks, "free + used != total"
