"""Frames named as rows of their source tensors (voxflow/engine/frame_rows.py): what the codec stage hands an async
codec, gathered on the device in one indexed copy."""
import pytest
import torch

from voxflow.engine.frame_rows import FrameRows, stack_sources


def step(k: int, rows: int = 4) -> torch.Tensor:
    """A step's frames [rows, 16]: code 0 says (step, row), the rest are the row's own pattern."""
    t = torch.arange(rows * 16, dtype=torch.long).view(rows, 16) + 1000 * k
    t[:, 0] = 100 * k + torch.arange(rows)
    return t


def test_rows_name_each_source_once_and_pick_the_right_frames():
    steps = [step(k) for k in range(3)]
    block = torch.full((5, 16), 7, dtype=torch.long)
    requests = [[(steps[0], 1, 1), (steps[1], 1, 1), (steps[2], 1, 1)],     # one row of three steps
                [(steps[0], 3, 1), (block, 2, 3)],                         # a row, then a slice of a block
                [(steps[2], 0, 2)]]                                        # two rows of one source
    fr = FrameRows(requests)
    assert len(fr.sources) == 4 and fr.counts() == [3, 4, 2]
    want = [torch.stack([steps[0][1], steps[1][1], steps[2][1]]),
            torch.cat([steps[0][3:4], block[2:5]]),
            steps[2][0:2]]
    got = fr.tensors()
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert got[2].data_ptr() == steps[2].data_ptr()             # one piece: a view, no copy
    assert FrameRows([[]]).tensors()[0].shape == (0, 0)   # a request without frames


def test_gather_pads_frames_and_requests_with_zero_codes():
    steps = [step(k) for k in range(2)]
    fr = FrameRows([[(steps[0], 0, 1), (steps[1], 0, 1)], [(steps[1], 2, 1)], [(steps[0], 3, 1)]])
    stacked = stack_sources(fr.sources, 16, torch.device("cpu"), lambda t: t)
    assert stacked.shape == (9, 16) and not stacked[-1].any()              # the zero row last
    out = fr.gather(stacked, [1, 0], padded=4, length=3, index_to_device=lambda t: t)
    assert out.shape == (4, 3, 16)
    assert torch.equal(out[0, 0], steps[1][2]) and not out[0, 1:].any()    # request 1: one frame, then zeros
    assert torch.equal(out[1, :2], torch.stack([steps[0][0], steps[1][0]])) and not out[1, 2].any()
    assert not out[2:].any()                                               # padding requests
    with pytest.raises(ValueError, match="more than 1"):
        fr.gather(stacked, [0], padded=1, length=1, index_to_device=lambda t: t)


def test_sources_are_checked_and_cast_to_int64():
    with pytest.raises(ValueError, match=r"frames must be \[n, 16\]"):
        stack_sources([torch.zeros(3, 15, dtype=torch.long)], 16, torch.device("cpu"), lambda t: t)
    stacked = stack_sources([torch.ones(2, 16, dtype=torch.int32)], 16, torch.device("cpu"), lambda t: t)
    assert stacked.dtype == torch.long and stacked[:2].eq(1).all()
