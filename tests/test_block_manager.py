"""Paged KV block manager: allocation, growth, release, prefix caching and LRU eviction."""
import pytest
import torch

from voxflow.engine.block_manager import BlockManager, num_blocks_for
from voxflow.engine.model_api import KVSpec
from voxflow.engine.sequence import Sequence

BS = 4


def seq(keys, max_frames=8, name=None):
    return Sequence(name or f"r{id(keys)}", list(keys), max_frames)


def prefill_all(bm, s):
    """Allocate and mark the whole prefill target computed (as the scheduler does chunk by chunk)."""
    cached = bm.allocate(s)
    bm.mark_computed(s, s.num_prefill_target)
    return cached


def test_num_blocks_for_divides_memory_by_block_bytes():
    spec = KVSpec(num_layers=2, num_kv_heads=4, head_dim=8, dtype=torch.bfloat16)
    per_block = spec.bytes_per_token * 16               # 2*2*4*8*2 = 256 B per token
    assert num_blocks_for(10 * per_block + per_block - 1, spec, 16) == 10
    assert num_blocks_for(0, spec, 16) == 0


def test_allocate_append_free_roundtrip():
    bm = BlockManager(num_blocks=8, block_size=BS)
    s = seq(range(10))                                   # 10 positions -> 3 blocks
    assert bm.can_allocate(s)
    assert prefill_all(bm, s) == 0
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    assert bm.usage() == pytest.approx(3 / 8)
    # Positions 10, 11 fit in block 2; position 12 starts a new block.
    for expected_blocks in (3, 3, 4):
        bm.append_slot(s)
        bm.mark_computed(s, s.num_computed + 1)
        assert len(s.block_table) == expected_blocks
    assert bm.slot_mapping(s, 11, 13) == [s.block_table[2] * BS + 3, s.block_table[3] * BS + 0]
    bm.check_invariants()
    bm.free(s)
    assert s.block_table == [] and bm.num_free_blocks == 8 and bm.usage() == 0
    bm.check_invariants()


def test_same_three_block_prefix_reuses_three_blocks():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(list(range(12)) + [100, 101])                # 3 full prompt blocks + 2 positions
    prefill_all(bm, a)
    b = seq(list(range(12)) + [200, 201, 202])
    assert bm.allocate(b) == 12
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]
    assert all(bm.blocks[x].ref_count == 2 for x in a.block_table[:3])
    assert b.num_computed == 12 and b.num_cached == 12
    bm.check_invariants()


def test_different_key_in_block_two_reuses_only_block_one():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(range(13))
    prefill_all(bm, a)
    keys = list(range(13))
    keys[5] = -1                                         # second block differs -> so does the third's chain
    b = seq(keys)
    assert bm.allocate(b) == 4
    assert b.block_table[0] == a.block_table[0]
    assert not set(b.block_table[1:]) & set(a.block_table)
    bm.check_invariants()


def test_last_position_is_always_computed():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(range(8))                                    # exactly two full blocks
    prefill_all(bm, a)
    b = seq(range(8))                                    # identical prompt
    assert bm.allocate(b) == 4                           # the last block holds the last position: recomputed
    assert b.num_prefill_target - b.num_computed == 4
    assert b.block_table[1] != a.block_table[1]


def test_blocks_are_published_only_once_computed():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(range(13))
    bm.allocate(a)
    bm.mark_computed(a, 6)                               # only block 0 is complete
    b = seq(range(13))
    assert bm.allocate(b) == 4
    bm.check_invariants()


def test_finished_prompt_blocks_stay_cached_generated_ones_do_not():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(range(8))
    prefill_all(bm, a)
    for _ in range(5):                                   # generated positions 8..12 fill block 2
        bm.append_slot(a)
        bm.mark_computed(a, a.num_computed + 1)
    gen_block = a.block_table[2]
    bm.free(a)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 16
    assert bm.blocks[gen_block].hash is None
    b = seq(list(range(8)) + [7, 7])
    assert bm.allocate(b) == 8
    bm.check_invariants()


def test_lru_evicts_least_recently_freed_cached_blocks_first():
    bm = BlockManager(num_blocks=7, block_size=BS)
    old, new = seq(range(0, 9)), seq(range(100, 109))    # 3 blocks each, the first 2 cacheable
    prefill_all(bm, old)
    bm.free(old)
    prefill_all(bm, new)
    bm.free(new)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 7
    # 5 fresh blocks with 3 plain free ones: the two cached blocks of `old` (freed first) are evicted.
    filler = seq(range(1000, 1020))
    prefill_all(bm, filler)
    assert bm.num_cached_blocks == 2
    bm.free(filler)
    bm.check_invariants()
    assert bm.allocate(seq(range(100, 109))) == 8        # `new` survived
    assert bm.allocate(seq(range(0, 9))) == 0            # `old` was evicted
    bm.check_invariants()


def test_eviction_takes_a_chains_tail_before_its_head():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(range(13))                                   # blocks 0..2 cacheable, block 3 holds position 12
    prefill_all(bm, a)
    bm.free(a)
    filler = seq(range(500, 506))
    bm.allocate(filler)                                  # 2 fresh blocks: the plain free one + one eviction
    bm.free(filler)
    assert bm.allocate(seq(range(13))) == 8              # the head of the chain is still there


def test_hit_on_unreferenced_cached_block_counts_against_free_capacity():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq(range(9))
    prefill_all(bm, a)
    bm.free(a)                                           # 2 cached + 1 free
    b = seq(range(9))
    assert bm.can_allocate(b)                            # 2 hits + 1 fresh = exactly the pool
    c = seq(list(range(8)) + [1, 2, 3, 4, 5])            # 2 hits + 2 fresh > pool
    assert not bm.can_allocate(c)


def test_can_append_counts_only_sequences_at_a_block_boundary():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a, b = seq(range(4)), seq(range(10, 13))
    prefill_all(bm, a)                                   # full block: next position needs a new block
    prefill_all(bm, b)                                   # 3 of 4: room in its block
    assert bm.num_free_blocks == 1
    assert bm.can_append([a, b])
    bm.append_slot(a)
    bm.mark_computed(a, 5)
    bm.append_slot(b)
    bm.mark_computed(b, 4)
    assert not bm.can_append([b]) and bm.can_append([a])
    with pytest.raises(RuntimeError):
        bm.append_slot(b)
    bm.check_invariants()


def test_concurrent_twin_blocks_keep_one_published_copy():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = seq(range(6)), seq(range(6))
    bm.allocate(a)
    bm.allocate(b)                                       # nothing published yet: no sharing
    bm.mark_computed(a, 6)
    bm.mark_computed(b, 6)
    assert bm.blocks[b.block_table[0]].hash is None      # a's copy is the published one
    bm.free(b)
    bm.free(a)
    assert bm.num_cached_blocks == 1
    bm.check_invariants()


def test_default_kv_bytes_caps_the_pool_by_free_gpu_memory():
    from voxflow.engine.block_manager import DEFAULT_KV_FREE_FRACTION, DEFAULT_POSITIONS_PER_SEQ, default_kv_bytes
    per_token = 28 * 2 * 8 * 128 * 2                      # the 1.7B talker in bf16
    # CPU (no free-memory figure): room for every slot.
    assert default_kv_bytes(per_token, 4, None) == per_token * 4 * DEFAULT_POSITIONS_PER_SEQ
    # 256 slots on a GPU with 130 GB free: capped at the fraction, not the 120 GB the slots would ask.
    free = 130 * 10**9
    assert default_kv_bytes(per_token, 256, free) == int(free * DEFAULT_KV_FREE_FRACTION)
    # A few slots fit under the cap: unchanged.
    assert default_kv_bytes(per_token, 8, free) == per_token * 8 * DEFAULT_POSITIONS_PER_SEQ
