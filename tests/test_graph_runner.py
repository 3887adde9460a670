"""DecodeRunner on CPU: bucketed padding, scratch rows and pages, width buckets (CUDA graphs: tests/gpu)."""
import torch

from voxflow.engine.graph_runner import DecodeRunner, batch_buckets, width_bucket
from voxflow.engine.model_api import DecodeOutput


class RecordingModel:
    """Stands in for a TTSModel: records what decode receives, returns the slot ids as 'frames'."""
    device = "cpu"
    padding_slot = 99
    graph_epoch = 0

    def __init__(self):
        self.calls = []

    def decode_variant(self):
        return (False, False)

    def decode(self, slots, kv):
        self.calls.append((slots.clone(), kv.block_tables.clone(), kv.context_lens.clone(), kv.slot_mapping.clone()))
        frames = slots[:, None].expand(-1, 16).clone()
        return DecodeOutput(frames, slots == 2, torch.zeros_like(slots, dtype=torch.bool))


def test_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert batch_buckets(1) == [1]
    assert batch_buckets(100)[-3:] == [64, 96, 100]
    assert [width_bucket(w) for w in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


def test_padding_rows_use_the_scratch_slot_and_page():
    model = RecordingModel()
    runner = DecodeRunner(model, [], [], block_size=16, max_batch=8, max_width=64, scratch_block=7,
                          cuda_graphs=True)           # no CUDA here: runs eagerly, same padding and buffers
    out = runner.run([3, 1, 2], [[0, 1, 2], [3], [4, 5]], [40, 5, 20], [39, 52, 83])
    slots, tables, lens, mapping = model.calls[-1]
    assert slots.tolist() == [3, 1, 2, 99]                                   # bucket 4, one padding row
    assert tables.shape == (4, 4)                                            # widest table 3 -> width 4
    assert tables.tolist() == [[0, 1, 2, -1], [3, -1, -1, -1], [4, 5, -1, -1], [7, -1, -1, -1]]
    assert lens.tolist() == [40, 5, 20, 1]
    assert mapping[:, 0].tolist() == [39, 52, 83, 7 * 16]
    assert out.frames.shape == (3, 16) and out.frames[:, 0].tolist() == [3, 1, 2]
    assert out.finished.tolist() == [False, False, True]
    # A narrower, smaller step afterwards must not see stale entries of the previous one; the third step reuses the
    # first one's host staging buffer (two are alternated), which still holds its 4 x 4 table.
    runner.run([5], [[9]], [3], [146])
    slots, tables, lens, mapping = model.calls[-1]
    assert slots.tolist() == [5] and tables.tolist() == [[9]] and lens.tolist() == [3]
    runner.run([6, 4], [[8], [10]], [2, 7], [17, 18])
    slots, tables, lens, mapping = model.calls[-1]
    assert slots.tolist() == [6, 4] and tables.tolist() == [[8], [10]]
    assert lens.tolist() == [2, 7] and mapping[:, 0].tolist() == [17, 18]


def test_fixed_width_and_limits():
    model = RecordingModel()
    runner = DecodeRunner(model, [], [], block_size=16, max_batch=4, max_width=10, scratch_block=0,
                          cuda_graphs=False, fixed_width=True)
    runner.run([0], [[1]], [1], [16])
    assert model.calls[-1][1].shape == (1, 16)                               # always the (pow2) max width
    import pytest
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        runner.run(list(range(5)), [[1]] * 5, [1] * 5, [16] * 5)
    with pytest.raises(ValueError, match="exceeds"):
        runner.run([0], [list(range(17))], [1], [16])


class _ReplayCounter:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class PrefillModel:
    """Stands in for a TTSModel's prefill side; `graph_epoch` is what its slot-buffer reallocation bumps."""
    device = "cpu"
    graph_epoch = 0

    def __init__(self):
        self.outputs = []

    def prefill_input_spec(self):
        return 4, torch.float32

    def prefill_outputs(self, rows, last_hidden):
        self.outputs.append((rows, last_hidden.clone()))


def test_prefill_graphs_are_kept_when_the_decode_buffers_are_reallocated():
    """The prefill graphs read no per-slot decode buffer, so a model's graph_epoch change (decode buffers
    reallocated) must neither drop them nor fail a replay planned before it (tests/gpu: the same on the GPU)."""
    from voxflow.engine.prefill_runner import PrefillItem, PrefillRunner
    model = PrefillModel()
    runner = PrefillRunner(model, None, None, block_size=16, scratch_block=7, max_tokens=256, max_batch=4,
                           cuda_graphs=False)
    runner.cuda_graphs = True                 # as on CUDA: replay a stand-in graph with a static output
    key = runner.shapes[0]
    graph, out = _ReplayCounter(), torch.arange(key[0] * 4, dtype=torch.float32).view(key[0], 4)   # a row a chunk
    runner._graphs[key] = (graph, out)
    item = PrefillItem(slot=2, embeds=torch.ones(3, 4), start=0, end=3, block_table=[5], slot_mapping=[80, 81, 82],
                       last=True)
    assert runner.plan([(0, 3)]) == key
    model.graph_epoch += 1                    # e.g. a long text grew the slot buffers between plan and run
    runner.run(key, [item])
    runner.run(runner.plan([(0, 3)]), [item])
    assert graph.replays == 2 and runner.stats.replays == 2 and key in runner._graphs
    rows, last = model.outputs[-1]
    assert rows == [(2, True)] and torch.equal(last, out[:1])


def test_packed_inputs_start_16_byte_aligned_at_any_batch():
    """The four decode inputs share one buffer (one copy a step); each starts 16-byte aligned, odd batches too (the
    c=1 engine's largest bucket is 1)."""
    for max_batch in (1, 3, 8):
        runner = DecodeRunner(RecordingModel(), [], [], block_size=16, max_batch=max_batch, max_width=4,
                              scratch_block=0, cuda_graphs=False)
        for views in (runner._dev, *runner._host):
            assert all(v.data_ptr() % 16 == 0 for v in views.values()), max_batch


def test_capture_inputs_point_every_row_at_the_scratch_slot_and_page():
    """What a capture's warm-up decodes (`_pad_inputs`, written into the device inputs): every row the scratch slot
    and page, so no live request's state moves; the rest of the buffer is left as it was."""
    runner = DecodeRunner(RecordingModel(), [], [], block_size=16, max_batch=8, max_width=8, scratch_block=7,
                          cuda_graphs=False)
    runner._dev_buf.fill_(5)
    runner._pad_inputs(bucket=4, width=2)
    views = runner._dev
    assert set(views["slots"].tolist()) == {99} and set(views["lens"].tolist()) == {1}
    assert set(views["mapping"][:, 0].tolist()) == {7 * 16}
    assert views["tables"].view(-1)[:8].view(4, 2).tolist() == [[7, -1]] * 4
    assert set(views["tables"].view(-1)[8:].tolist()) == {-1}
