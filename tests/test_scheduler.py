"""Scheduler: continuous batching, chunked prefill, preemption, abort, rejection — driven by a fake model loop
that writes a content tag into a fake paged cache at every scheduled slot and checks, before each chunk or decode,
that the sequence's whole context reads back what it should (so a wrong prefix-cache hit, a block shared by
mistake or a lost position fails)."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from voxflow.engine.block_manager import BlockManager, blocks_for
from voxflow.engine.scheduler import Scheduler, SchedulerConfig
from voxflow.engine.sequence import Sequence, SeqStatus


class FakeEngine:
    def __init__(self, num_blocks, block_size, max_num_seqs=4, max_num_batched_tokens=16, chunk=None,
                 reserve_frames=0):
        self.bm = BlockManager(num_blocks, block_size)
        self.config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, chunk, reserve_frames)
        self.sched = Scheduler(self.config, self.bm)
        self.cache = {}                   # flat slot -> content tag
        self.eos_after = {}               # request_id -> frames after which the model says "finished"
        self.late = []                    # finished flags read one step late, like the real engine
        self.finished, self.rejected, self.outputs = [], [], []

    def add(self, keys, max_frames, eos_after=None, name=None):
        s = Sequence(name or f"r{len(self.eos_after)}", keys, max_frames)
        self.eos_after[s.request_id] = eos_after
        self.sched.add(s)
        return s

    @staticmethod
    def expected(seq, p):
        # KV at a prompt position depends on the whole key prefix; fed-back frames are the request's own.
        return tuple(seq.position_keys[:p + 1]) if p < seq.prompt_len else (seq.request_id, p)

    def _check_context(self, seq, end):
        got = [self.cache.get(x) for x in self.bm.slot_mapping(seq, 0, end)]
        assert got == [self.expected(seq, p) for p in range(end)], f"corrupt context for {seq}"

    def _write(self, seq, start, end):
        for p, x in zip(range(start, end), self.bm.slot_mapping(seq, start, end)):
            self.cache[x] = self.expected(seq, p)

    def step(self):
        out = self.sched.schedule()
        self.outputs.append(out)
        self.bm.check_invariants()
        assert out.num_tokens <= self.config.max_num_batched_tokens
        holders = [s for s in self.sched._live.values() if s.slot is not None]
        assert len({s.slot for s in holders}) == len(holders) <= self.config.max_num_seqs
        self.rejected += [r.seq for r in out.rejected]
        for seq, start, end, last in out.prefill:
            assert 0 < end - start and seq.status in (SeqStatus.PREFILLING, SeqStatus.RUNNING)
            if self.config.prefill_chunk_size:
                assert end - start <= self.config.prefill_chunk_size
            assert last == (end == seq.prompt_len + seq.num_frames)
            self._check_context(seq, start)
            self._write(seq, start, end)
        for seq in out.decode:
            assert seq.status is SeqStatus.RUNNING and seq.num_frames <= seq.max_frames
            assert seq.num_computed == seq.prompt_len + seq.num_frames
            self._check_context(seq, seq.num_computed - 1)
            self._write(seq, seq.num_computed - 1, seq.num_computed)
        for seq in self.late:                       # flags of the previous step arrive now
            self.sched.finish(seq)
            self.finished.append(seq)
        self.late = [s for s in out.decode if s.num_frames in (s.max_frames, self.eos_after[s.request_id])]
        self.bm.check_invariants()
        return out

    def run(self, max_steps=2000):
        for _ in range(max_steps):
            if not self.sched.has_unfinished() and not self.late:
                return
            self.step()
        raise AssertionError("requests did not finish")

    def assert_all_blocks_free(self):
        assert self.bm.usage() == 0 and self.bm.num_free_blocks == self.bm.num_blocks
        assert all(b.ref_count == 0 for b in self.bm.blocks)
        assert self.sched.num_waiting == self.sched.num_running == 0
        assert sorted(self.sched._free_slots) == list(range(self.config.max_num_seqs))


def test_tiny_pool_preempts_and_every_request_still_finishes():
    eng = FakeEngine(num_blocks=6, block_size=4, max_num_seqs=4)
    seqs = [eng.add([i * 100 + j for j in range(4)], max_frames=12) for i in range(4)]   # 4 blocks each at most
    eng.run()
    assert any(out.preempted for out in eng.outputs)
    assert all(s.status is SeqStatus.FINISHED and s.num_frames == 12 for s in seqs)
    assert set(eng.finished) == set(seqs) and not eng.rejected
    # The oldest request is never the victim while others hold blocks.
    assert seqs[0].num_preemptions == 0
    eng.assert_all_blocks_free()


def test_reserving_growth_queues_requests_instead_of_preempting_them():
    # The tiny pool above: each request ends at 4 blocks, the pool has 6, so only one runs at a time.
    eng = FakeEngine(num_blocks=6, block_size=4, max_num_seqs=4, reserve_frames=12)
    seqs = [eng.add([i * 100 + j for j in range(4)], max_frames=12) for i in range(4)]
    eng.run()
    assert not any(out.preempted for out in eng.outputs)
    assert all(s.num_frames == 12 and s.num_preemptions == 0 for s in seqs) and set(eng.finished) == set(seqs)
    assert max(len(out.decode) for out in eng.outputs) == 1
    eng.assert_all_blocks_free()


def test_reservation_counts_each_holders_growth_up_to_reserve_frames():
    # Prompts of one block; 4 more frames need one more block each: 2 blocks a request, 5 fit in 10 (all 6 without
    # the reservation).
    for reserve, admitted in ((4, 5), (0, 6)):
        eng = FakeEngine(num_blocks=10, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, reserve_frames=reserve)
        for i in range(6):
            eng.add([i * 100 + j for j in range(4)], max_frames=12)
        assert len(eng.step().prefill) == admitted, reserve


def test_reserve_frames_must_not_be_negative():
    with pytest.raises(ValueError, match="reserve_frames"):
        SchedulerConfig(4, 16, None, -1)


def test_preempted_sequence_resumes_first_with_prompt_plus_fed_back_frames():
    eng = FakeEngine(num_blocks=4, block_size=2, max_num_seqs=2)
    a = eng.add([1, 2], max_frames=6)
    b = eng.add([3, 4], max_frames=6)
    while not any(out.preempted for out in eng.outputs):
        eng.step()
    assert eng.outputs[-1].preempted == [b] and b.status is SeqStatus.PREEMPTED
    assert b.slot is not None and b.num_prefill_target == 2 + b.num_frames and b.block_table == []
    c = eng.add([5, 6], max_frames=1)
    while b.status is SeqStatus.PREEMPTED:
        assert c.status is SeqStatus.WAITING                 # the preempted sequence goes first
        out = eng.step()
    assert out.prefill[0].seq is b and out.prefill[0].end == 2 + b.num_frames
    eng.run()
    assert a.num_frames == b.num_frames == 6 and c.num_frames == 1
    eng.assert_all_blocks_free()


def test_chunked_prefill_respects_budget_and_never_starves_decodes():
    eng = FakeEngine(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=8, chunk=5)
    short = eng.add([1, 2, 3], max_frames=30)
    eng.step()                                               # short prefills in one chunk
    long = eng.add(list(range(100, 150)), max_frames=2)
    chunks = []
    while long.status is not SeqStatus.RUNNING:
        out = eng.step()
        assert out.decode == [short]                         # one decode every step meanwhile
        chunks += [(c.start, c.end) for c in out.prefill]
    assert all(e - s <= 5 for s, e in chunks)
    assert [s for s, _ in chunks] == [0] + [e for _, e in chunks[:-1]] and chunks[-1][1] == 50
    eng.run()
    eng.assert_all_blocks_free()


def test_prompt_larger_than_the_pool_is_rejected_without_blocking_others():
    eng = FakeEngine(num_blocks=4, block_size=4)
    big = eng.add(list(range(10)), max_frames=7)             # 17 positions > 16
    small = eng.add([1, 2], max_frames=3)
    out = eng.step()
    assert [r.seq for r in out.rejected] == [big] and "KV positions" in out.rejected[0].reason
    assert big.status is SeqStatus.FINISHED and small.status is SeqStatus.RUNNING
    eng.run()
    eng.assert_all_blocks_free()


def test_max_num_seqs_bounds_admissions():
    eng = FakeEngine(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=32)
    seqs = [eng.add([i, i + 1], max_frames=3) for i in range(0, 10, 2)]
    eng.step()
    assert [s.slot for s in seqs[:2]] == [0, 1] and all(s.status is SeqStatus.WAITING for s in seqs[2:])
    eng.run()
    eng.assert_all_blocks_free()


def test_second_request_with_same_prompt_starts_after_the_cached_prefix():
    eng = FakeEngine(num_blocks=64, block_size=4)
    keys = list(range(13))
    eng.add(keys, max_frames=2)
    eng.run()
    again = eng.add(keys, max_frames=2, name="again")
    out = eng.step()
    assert [(c.start, c.end) for c in out.prefill] == [(12, 13)] and again.num_cached == 12
    eng.run()
    eng.assert_all_blocks_free()


def _abort_and_check(eng, seq, state):
    assert seq.status is state
    held = len(seq.block_table)
    free_before = eng.bm.num_free_blocks
    assert eng.sched.abort(seq.request_id) is seq
    assert seq.status is SeqStatus.FINISHED and seq.block_table == [] and seq.slot is None
    assert eng.bm.num_free_blocks == free_before + held      # its blocks were held by it alone here
    eng.bm.check_invariants()
    assert eng.sched.abort(seq.request_id) is None           # already gone


def test_abort_in_every_state_returns_every_block_and_slot():
    eng = FakeEngine(num_blocks=8, block_size=2, max_num_seqs=3, max_num_batched_tokens=4)
    _abort_and_check(eng, eng.add([9, 9, 9], max_frames=3), SeqStatus.WAITING)
    old = eng.add([1, 2], max_frames=14)
    eng.step()
    _abort_and_check(eng, eng.add(list(range(10, 16)), max_frames=2), SeqStatus.WAITING)
    prefilling = eng.add(list(range(20, 26)), max_frames=2)
    eng.step()
    _abort_and_check(eng, prefilling, SeqStatus.PREFILLING)
    new = eng.add([3, 4], max_frames=14)
    while not eng.outputs[-1].preempted:
        eng.step()
    assert eng.outputs[-1].preempted == [new]
    _abort_and_check(eng, new, SeqStatus.PREEMPTED)
    _abort_and_check(eng, old, SeqStatus.RUNNING)
    assert eng.sched.abort("nope") is None
    eng.late = []
    eng.run()
    eng.assert_all_blocks_free()


def test_finish_of_a_sequence_preempted_meanwhile_frees_its_slot():
    eng = FakeEngine(num_blocks=8, block_size=2, max_num_seqs=2)
    s = eng.add([1, 2, 3], max_frames=5)
    while s.num_frames == 0:
        eng.step()
    eng.sched._preempt(s)                                    # as if memory pressure hit it
    eng.sched.finish(s)
    assert s.status is SeqStatus.FINISHED and s.slot is None and eng.sched.num_waiting == 0
    eng.bm.check_invariants()


# ---- property test: random arrivals, aborts, prompt lengths and shared prefixes ------------------------------
request = st.fixed_dictionaries({
    "arrive": st.integers(0, 12),
    "prefix": st.integers(0, 2),            # which shared prefix the prompt starts with
    "shared": st.integers(0, 9),            # how much of it
    "tail": st.integers(0, 5),              # then keys of its own
    "max_frames": st.integers(1, 9),
    "eos": st.none() | st.integers(1, 9),   # frames after which the model stops (if before max_frames)
    "abort": st.none() | st.integers(0, 40),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block_size=st.integers(1, 4),
    num_blocks=st.integers(3, 20),
    max_num_seqs=st.integers(1, 4),
    extra_tokens=st.integers(1, 10),
    chunk=st.none() | st.integers(1, 6),
    reserve=st.sampled_from([0, 2, 100]),
    reqs=st.lists(request, min_size=1, max_size=8),
)
def test_random_traffic_keeps_invariants_and_finishes_everything(block_size, num_blocks, max_num_seqs,
                                                                 extra_tokens, chunk, reserve, reqs):
    eng = FakeEngine(num_blocks, block_size, max_num_seqs, max_num_seqs + extra_tokens, chunk, reserve)
    added, aborted = [], set()
    for step in range(3000):
        for i, r in enumerate(reqs):
            if r["arrive"] == step:
                keys = [r["prefix"] * 1000 + j for j in range(r["shared"])] + [-(i * 100 + j) for j in
                                                                                 range(r["tail"])]
                added.append(eng.add(keys, r["max_frames"], r["eos"], name=f"q{i}"))
            if r["abort"] == step and eng.sched.abort(f"q{i}") is not None:
                aborted.add(f"q{i}")
        if step > 12 and not eng.sched.has_unfinished() and not eng.late:
            break
        eng.step()
    else:
        raise AssertionError("requests did not finish")
    if reserve >= max(r["max_frames"] for r in reqs):
        # Room for every admitted request's whole growth: nothing is ever preempted.
        assert not any(out.preempted for out in eng.outputs)
    done = {s.request_id for s in eng.finished} | aborted
    for s in added:
        assert s.status is SeqStatus.FINISHED
        if s in eng.rejected:
            assert s.prompt_len == 0 or blocks_for(s.max_positions, block_size) > num_blocks
        else:
            assert s.request_id in done
            if s.request_id not in aborted:
                assert s.num_frames >= min(s.max_frames, eng.eos_after[s.request_id] or s.max_frames)
    eng.assert_all_blocks_free()
