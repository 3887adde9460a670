"""The decode step's fused talker-input kernel (kernels/frame_input.py) == SlotTable.frame_input's torch ops,
exactly (CPU: Triton's interpreter in a subprocess, since TRITON_INTERPRET must be set before triton is first
imported; GPU: tests/gpu/test_gpu_frame_input.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_FRAME_INPUT_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def make_case(device="cpu", dtype=torch.float32, hidden=40, slots=6, seed=0):
    """A SlotTable whose slots 0, 2 and 4 hold trailing texts of 5, 70 (three pages) and 0 rows, and one step's
    batch over them plus two padding rows on the scratch slot: frame indices inside the text, at its end, past it,
    and past every page the table can name (clamped)."""
    from voxflow.models.qwen3_tts.slots import SlotTable
    g = torch.Generator().manual_seed(seed)
    table = SlotTable(slots, hidden, 50, 16, dtype, torch.device(device), trailing_cap=96, history_cap=16)
    texts = [torch.randn(rows, hidden, generator=g).to(dtype).to(device) for rows in (5, 70, 0)]
    table._load_texts([0, 2, 4], torch.tensor([0, 2, 4], device=device), texts)
    rows = torch.tensor([2, 0, 4, 2, 0, slots, slots])
    fed = torch.tensor([33, 5, 0, 69, 10 ** 6, 0, 1])
    trailing_len = torch.tensor([70, 5, 0, 70, 5, 0, 0])
    prompt_len = torch.tensor([12, 40, 7, 12, 40, 0, 0])
    embed = torch.randn(7, hidden, generator=g).to(dtype)
    pad = torch.randn(hidden, generator=g).to(dtype)
    args = [t.to(device) for t in (rows, fed, trailing_len, prompt_len, embed, pad)]
    return table, args


def check_kernel_equals_reference(device="cpu", dtype=torch.float32, hidden=40):
    from voxflow.kernels.frame_input import frame_input
    table, (rows, fed, trailing_len, prompt_len, embed, pad) = make_case(device, dtype, hidden)
    want_x = embed + table.text_part(rows, fed, pad, trailing_len)
    want_pos = prompt_len + fed
    x, pos = frame_input(embed, rows, fed, trailing_len, prompt_len, table.text_table, table.text_pages, pad)
    assert x.dtype == want_x.dtype and torch.equal(x, want_x)
    assert torch.equal(pos, want_pos)
    # the text rows really are the slots' rows (row 33 of slot 2 is on its second page) or pad past the text
    assert not torch.equal(x[0], embed[0] + pad) and torch.equal(x[1], embed[1] + pad)
    assert torch.equal(x[4], embed[4] + pad)


def check_sum_of_rows_against_reference(dtype, hidden, device="cpu"):
    """With more_rows (the frame's 16 embedding rows, predict's embed_parts): the kernel sums embed and rows[:, 1:]
    (fp32, in row order, one rounding) where the reference stacks and sums them with torch: within one rounding of
    that sum (one ulp of it, then the same add), and in bf16 on these rows mostly the same bits."""
    from voxflow.kernels.frame_input import frame_input
    table, (rows, fed, trailing_len, prompt_len, embed, pad) = make_case(device, dtype, hidden)
    g = torch.Generator().manual_seed(3)
    more = (torch.randn(7, 16, hidden, generator=g) * torch.logspace(-3, 0, 16)[None, :, None]).to(dtype).to(device)
    # (SlotTable.frame_input's torch path, spelled out: on a GPU with the kernel switched on it would be the kernel)
    want = torch.cat((embed[:, None], more[:, 1:]), dim=1).sum(dim=1) + table.text_part(rows, fed, pad, trailing_len)
    want_pos = prompt_len + fed
    if device == "cpu":
        got_x, got_pos = table.frame_input(rows, fed, trailing_len, prompt_len, (embed, more), pad)
        assert torch.equal(got_x, want) and torch.equal(got_pos, want_pos)
    x, pos = frame_input(embed, rows, fed, trailing_len, prompt_len, table.text_table, table.text_pages, pad,
                         more_rows=more)
    assert torch.equal(pos, want_pos)
    terms = torch.cat((embed[:, None], more[:, 1:]), dim=1).float()
    # Another order of a 16-term fp32 sum: within 16 x 2^-24 of the terms' magnitudes; then each side rounds the sum
    # and the add once to the dtype (an ulp of each).
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -24
    text = table.text_part(rows, fed, pad, trailing_len).float()
    bound = 16 * 2.0 ** -24 * terms.abs().sum(dim=1) + 2 * eps * (terms.sum(dim=1).abs() + want.float().abs()) + 1e-30
    assert bool(((x.float() - want.float()).abs() <= bound).all())
    assert bool(((want.float() - terms.sum(dim=1) - text).abs() <= bound + 2 * eps * text.abs()).all())
    if dtype == torch.bfloat16:     # 16 bf16 rows add up exactly in fp32 unless their magnitudes are far apart
        assert (x == want).float().mean().item() >= 0.99
    # the rows matter: without them the result is another one
    alone, _ = frame_input(embed, rows, fed, trailing_len, prompt_len, table.text_table, table.text_pages, pad)
    assert not torch.equal(alone, x)


def check_bf16_rounding_edges():
    """Ties to even, overflow to inf, inf and NaN operands, signed zeros: the kernel's hand-made rounding gives the
    reference's bits (compared as int16), NaN where it has NaN (whose payload torch does not fix). (Not subnormal
    sums: Triton's interpreter flushes them; embeddings never come near them.)"""
    from voxflow.kernels.frame_input import frame_input
    table, (rows, fed, trailing_len, prompt_len, embed, pad) = make_case("cpu", torch.bfloat16, 8)
    edges = torch.tensor([0.734375, 3.0e38, -3.0e38, float("inf"), float("nan"), -0.0, 0.5, -1.2421875])
    embed = edges.to(torch.bfloat16).expand(7, -1).contiguous()
    pad = torch.tensor([0.51171875, 3.0e38, -3.0e38, 1.0, 2.0, -0.0, 0.001953125, -0.00390625]).to(torch.bfloat16)
    fed = torch.full_like(fed, 10 ** 6)                                   # every row past its text: the pad row
    want = embed + table.text_part(rows, fed, pad, trailing_len)
    with np.errstate(over="ignore"):            # the interpreter's numpy: 3e38 + 3e38 overflows, as it must
        x, _ = frame_input(embed, rows, fed, trailing_len, prompt_len, table.text_table, table.text_pages, pad)
    nan = want.isnan()
    assert torch.equal(x.isnan(), nan) and bool(nan.any())
    assert torch.equal(x[~nan].view(torch.int16), want[~nan].view(torch.int16)), (x[0], want[0])


if IN_CHILD:
    def test_child_kernel_equals_reference():
        check_kernel_equals_reference()
        check_kernel_equals_reference(dtype=torch.bfloat16, hidden=1500)      # two column blocks

    def test_child_bf16_rounding_edges():
        check_bf16_rounding_edges()

    def test_child_sum_of_rows():
        check_sum_of_rows_against_reference(torch.float32, 40)
        check_sum_of_rows_against_reference(torch.bfloat16, 1500)
else:
    def test_frame_input_kernel_under_the_interpreter_equals_the_torch_ops():
        run_child(__file__, CHILD_FLAG)


def test_reference_frame_input_adds_the_text_row_and_gives_positions():
    """The torch ops (the CPU path): frame_embed plus the slot's text row while its text lasts, tts_pad after;
    positions P + fed."""
    table, (rows, fed, trailing_len, prompt_len, embed, pad) = make_case()
    x, pos = table.frame_input(rows, fed, trailing_len, prompt_len, embed, pad)
    page = int(table.text_table[2, 33 // 32])
    assert torch.equal(x[0], embed[0] + table.text_pages[page, 33 % 32])
    assert torch.equal(x[2], embed[2] + pad) and torch.equal(x[4], embed[4] + pad)
    assert pos.tolist() == (prompt_len + fed).tolist()
