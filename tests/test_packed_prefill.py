"""The packed prefill's plumbing (voxflow/engine/packed_prefill.py, prefill_dispatch._packed) without a model: what
one run hands the model (rows, positions, slots, context lengths, row tables, query tiles, the last row of each
chunk), and how a step's chunks are cut into runs. The engine-level equality with the reference is in
tests/test_engine.py (test_packed_prefill_equals_the_reference), the kernel in tests/test_kernel_paged_prefill.py.
"""
import types

import pytest

import torch

from voxflow.engine.packed_prefill import PackedPrefillRunner
from voxflow.engine.prefill_dispatch import PrefillDispatch
from voxflow.engine.prefill_runner import PrefillItem
from voxflow.kernels.paged_decode_attention import paged_decode_attention_ref
from voxflow.kernels.paged_prefill_attention import paged_prefill_attention_ref

H, BS, HKV, GROUP, D = 8, 4, 2, 2, 8


class SpyModel:
    device = "cpu"

    def __init__(self):
        self.seen, self.outputs = [], []

    def prefill_input_spec(self):
        return H, torch.float32

    def prefill_forward(self, x, positions, kv):
        self.seen.append((x.clone(), positions.clone(), kv))
        return x.clone()                                  # "hidden" = input: shows which rows come back

    def prefill_outputs(self, rows, last_hidden):
        self.outputs.append((rows, last_hidden.clone()))


def test_one_run_hands_the_model_each_chunks_rows_and_tiles_that_agree_with_them():
    model = SpyModel()
    runner = PackedPrefillRunner(model, None, None, BS, scratch_block=30, max_tokens=64, max_chunks=4,
                                 max_width=16, cuda_graphs=False)
    gen = torch.Generator().manual_seed(0)
    # (slot, start, end, pages): a fresh prompt, a chunk after a cached prefix, a one-row chunk
    specs = [(3, 0, 7, [5, 9]), (1, 6, 19, [2, 4, 11, 7, 8]), (0, 12, 13, [20, 21, 22, 23])]
    items = []
    for slot, start, end, pages in specs:
        mapping = [pages[p // BS] * BS + p % BS for p in range(start, end)]
        items.append(PrefillItem(slot, torch.randn(end, H, generator=gen), start, end, pages, mapping, True))
    key = runner.plan([(i.start, i.end) for i in items])
    assert key == (64, 8)                                # 21 rows -> T = 64; contexts up to 19 -> 5 pages -> W = 8
    runner.run(key, items)
    (x, positions, kv), = model.seen
    rows = sum(i.end - i.start for i in items)
    want_pos = torch.cat([torch.arange(i.start, i.end) for i in items])
    assert torch.equal(positions[:rows, 0], want_pos) and (positions[rows:] == 0).all()
    assert torch.equal(kv.context_lens[:rows], want_pos + 1) and (kv.context_lens[rows:] == 1).all()
    assert kv.slot_mapping[:rows, 0].tolist() == sum((i.slot_mapping for i in items), [])
    assert (kv.slot_mapping[rows:] == 30 * BS).all()     # padding rows write the scratch page
    assert torch.equal(x[:rows, 0], torch.cat([i.embeds[i.start:i.end] for i in items]))
    assert kv.rows_share_sequences
    # the tiles' view of the rows (what the kernel reads) == the row-by-row view (tables, lengths), on random pools
    blocks = 31
    k_pool, v_pool = torch.randn(2, blocks, BS, HKV, D, generator=gen)
    q = torch.randn(64, HKV * GROUP, D, generator=gen)
    chunk_tables, tiles = kv.prefill_tiles
    by_tiles = paged_prefill_attention_ref(q, k_pool, v_pool, chunk_tables, tiles, D ** -0.5)
    by_rows = paged_decode_attention_ref(q[:rows], k_pool, v_pool, kv.block_tables[:rows], kv.context_lens[:rows],
                                         D ** -0.5)
    torch.testing.assert_close(by_tiles[:rows], by_rows, rtol=1e-6, atol=1e-6)
    # each chunk's last row comes back to the model, in the items' order
    (out_rows, last), = model.outputs
    assert out_rows == [(i.slot, True) for i in items]
    assert torch.equal(last, torch.stack([i.embeds[i.end - 1] for i in items]))


class StubRunner:
    """Plans runs of at most 16 positions in all and contexts of at most 32: what `_packed` must cut around."""
    packed = True

    def __init__(self):
        self.runs = []

    def plan(self, spans):
        total = sum(e - s for s, e in spans)
        return (16, 8) if total <= 16 and max(e for _, e in spans) <= 32 else None

    def run(self, key, items):
        self.runs.append([(i.slot, i.start, i.end) for i in items])


def test_a_step_is_cut_into_runs_in_order_and_a_chunk_no_shape_holds_runs_eagerly():
    runner = StubRunner()
    dispatch = PrefillDispatch(model=None, k_cache=None, v_cache=None, block_manager=None, block_size=BS,
                               scratch_slot=0, runner=runner, batch_prefill=True)
    eager = []
    dispatch._eager = lambda c, e: eager.append((c.seq.slot, c.start, c.end))
    dispatch._graph = lambda key, pairs: runner.run(key, [types.SimpleNamespace(slot=c.seq.slot, start=c.start,
                                                                                end=c.end) for c, _ in pairs])

    def chunk(slot, start, end):
        return types.SimpleNamespace(seq=types.SimpleNamespace(slot=slot), start=start, end=end), None

    pairs = [chunk(0, 0, 10), chunk(1, 0, 5), chunk(2, 0, 4), chunk(3, 30, 40), chunk(4, 0, 20), chunk(5, 0, 3)]
    dispatch.run(pairs)
    # 10 + 5 fit, + 4 would not: a new run; slot 3's context (40) and slot 4's 20 positions fit no shape: eager,
    # in their place; slot 5 starts a run of its own after them
    assert runner.runs == [[(0, 0, 10), (1, 0, 5)], [(2, 0, 4)], [(5, 0, 3)]]
    assert eager == [(3, 30, 40), (4, 0, 20)]


@pytest.mark.parametrize("budget, top", [(4096, 4096), (3000, 3072), (2048, 2048), (5000, 6144), (9000, 16384)])
def test_packed_sizes_step_by_512_past_1024_up_to_the_budget(budget, top):
    """The step's packed sizes reach the step budget with at most 512 positions of padding past 1024 (a 2.2k-position
    step ran the 4096 graph before: as slow as a full one), and a plan takes the smallest size that holds a step."""
    runner = PackedPrefillRunner(SpyModel(), None, None, BS, scratch_block=30, max_tokens=budget, max_chunks=16,
                                 max_width=512, cuda_graphs=False)
    sizes = sorted({t for t, _ in runner.shapes})
    assert sizes[-1] == top
    gaps = [b - a for a, b in zip(sizes, sizes[1:]) if a >= 1024 and b <= 4096]
    assert gaps and max(gaps) == 512
    if budget >= 4096:
        assert runner.plan([(0, 548)] * 4)[0] == 2560                      # 2,192 rows (16 prompts' worth)


class FakeGraph:
    """Stands in for a CUDA graph on the CPU: `replay` runs the captured function again into the captured output."""

    def __init__(self, run, out):
        self.run, self.out = run, out

    def replay(self):
        self.out.copy_(self.run())


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_capture_then_replay_bookkeeping_gives_the_reference(packed, monkeypatch):
    """GraphedPrefill.capture / _replay (shared by both prefill runners) on the CPU, with the CUDA graph faked: every
    shape is captured once, from all-padding buffers, largest first, and serving replays the captured shapes only,
    the requests getting the reference's codes (a capture that left buffers dirty or a replay of the wrong shape
    would change them)."""
    import voxflow.engine.prefill_runner as pr
    from test_engine import assert_engine_matches_reference, drive, greedy, make_engine

    order = []

    def fake_capture(run, pool, side=None):
        out = run()
        return FakeGraph(run, out), out

    monkeypatch.setattr(pr, "warm_then_capture", fake_capture)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    name = "custom_voice_1b7"
    core = make_engine(name, prefill_graphs=True, packed_prefill=packed, max_num_batched_tokens=96)
    runner = core.prefill_runner
    runner.cuda_graphs = True
    pad_only = runner._pad_only
    runner._pad_only = lambda key: (order.append(key), pad_only(key))[1]      # called before each capture
    runner.capture()
    assert runner.stats.graphs == len(runner.shapes) == len(order)
    sizes = [key[0] * key[1] if len(key) == 3 else key[0] for key in order]  # positions: (B, L, W) or (T, W)
    assert sizes == sorted(sizes, reverse=True)
    # each graph keeps only what prefill_outputs reads: a row per chunk, not the whole hidden state
    hidden = core.model.prefill_input_spec()[0]
    for key, (_, out) in runner._graphs.items():
        assert out.shape == (runner.max_chunks if packed else key[0], hidden)
    reqs = [greedy("Hello world.", 6, voice="vivian", request_id="a"),
            greedy("This is a tiny test.", 5, voice="serena", instructions="Speak happily.", request_id="b")]
    results = drive(core, {0: reqs})
    assert runner.stats.replays > 0 and runner.stats.eager_steps == 0
    assert_engine_matches_reference(name, core, results, reqs)
