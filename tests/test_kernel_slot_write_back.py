"""The decode step's fused write-back kernel (kernels/slot_write_back.py) == SlotTable.write_back's torch ops,
exactly: every table it touches and the flags (CPU: Triton's interpreter in a subprocess, since TRITON_INTERPRET
must be set before triton is first imported; GPU: tests/gpu/test_gpu_slot_write_back.py)."""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_WRITE_BACK_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def make_case(device="cpu", dtype=torch.float32, hidden=40, vocab=50, slots=6, frames=8, seed=0):
    """A SlotTable with random state, and one step's batch: rows 2, 0, 4 and two padding rows on the scratch slot
    (the last row); frame indices inside and at / past the history's end (clamped); c0 = EOS on one row and the
    frame limit reached on another."""
    from voxflow.models.qwen3_tts.slots import SlotTable
    g = torch.Generator().manual_seed(seed)
    table = SlotTable(slots, hidden, vocab, 16, dtype, torch.device(device), trailing_cap=32, history_cap=frames)
    table.h.copy_(torch.randn(table.h.shape, generator=g))
    table.seen.copy_(torch.rand(table.seen.shape, generator=g) < 0.3)
    table.history.copy_(torch.randint(-5, 2048, table.history.shape, generator=g, dtype=torch.int16))
    table.c0.copy_(torch.randint(0, vocab, table.c0.shape, generator=g))
    table.fed.copy_(torch.randint(0, frames, table.fed.shape, generator=g))
    rows = torch.tensor([2, 0, 4, slots, slots])
    fed = torch.tensor([3, frames - 1, frames + 5, 0, 1])
    frame = torch.randint(0, 2048, (5, 16), generator=g)
    eos_id = vocab - 1
    c0_next = torch.tensor([7, eos_id, 11, 1, 2])
    hidden_rows = torch.randn(5, hidden, generator=g).to(dtype)
    max_frames = torch.tensor([100, 100, frames + 6, 100, 100])     # row 2 reaches its limit (fed + 1)
    args = [t.to(device) for t in (rows, fed, frame, c0_next, hidden_rows, max_frames)]
    return table, args, eos_id


def check_kernel_equals_reference(device="cpu", dtype=torch.float32, hidden=40):
    import voxflow.kernels as kernels
    from voxflow.models.qwen3_tts import slots as slots_mod
    results = []
    for fused in (False, True):
        table, args, eos_id = make_case(device, dtype, hidden)
        if fused:
            from voxflow.kernels.slot_write_back import slot_write_back
            flags = slot_write_back(*args, eos_id, table.c0, table.fed, table.h, table.seen, table.history)
        else:
            assert not (kernels.use_kernels(table.h) and slots_mod.WRITE_BACK_KERNEL) or device != "cpu"
            flags = table.write_back(*args, eos_id)
        results.append((flags, table))
    (ref_flags, ref), (got_flags, got) = results
    assert ref_flags.dtype == got_flags.dtype == torch.bool
    assert got_flags.tolist() == ref_flags.tolist() == [[False, False], [True, True], [True, False],
                                                         [False, False], [False, False]]
    # the scratch slot (last) takes the padding rows' racing writes: compare the real slots only
    real = slice(0, ref.h.shape[0] - 1)
    for name in ("h", "seen", "history"):
        assert torch.equal(getattr(got, name)[real], getattr(ref, name)[real]), name
    for name in ("c0", "fed"):
        assert torch.equal(getattr(got, name)[real], getattr(ref, name)[real]), name


if IN_CHILD:
    def test_child_kernel_equals_reference():
        check_kernel_equals_reference()
        check_kernel_equals_reference(dtype=torch.bfloat16, hidden=1500)      # two column blocks
else:
    def test_write_back_kernel_under_the_interpreter_equals_the_torch_ops():
        run_child(__file__, CHILD_FLAG)


def test_reference_write_back_records_the_step():
    """The torch ops themselves (the CPU path): each real row's frame lands at its (clamped) index, c0_next is
    marked seen and pending, fed advances, h is the row's hidden state; the flags say EOS / frame limit."""
    table, (rows, fed, frame, c0_next, hidden, max_frames), eos_id = make_case()
    flags = table.write_back(rows, fed, frame, c0_next, hidden, max_frames, eos_id)
    last = table.history.shape[1] - 1
    for i in range(3):
        slot = int(rows[i])
        assert torch.equal(table.history[slot, min(int(fed[i]), last)], frame[i].to(torch.int16))
        assert bool(table.seen[slot, c0_next[i]]) and int(table.c0[slot]) == int(c0_next[i])
        assert int(table.fed[slot]) == int(fed[i]) + 1 and torch.equal(table.h[slot], hidden[i])
    assert flags[:3].tolist() == [[False, False], [True, True], [True, False]]
