"""The talker's input for a decode step -- the completed frame's embedding plus the slot's trailing-text row (tts_pad
once the text is used up) -- and the step's positions, in one Triton kernel (`SlotTable.frame_input` is the torch
reference).

The reference is ~9 small torch kernels (the frame index clamped, its text page and row found by a division and a
modulo, two gathers, the comparison with the text's length, the select, the add, the positions' add): each ~1-4 us
plus a launch gap on the c=1 step's critical path (H200 session 30 call 5's timeline: ~18 us a step). Here one
program per batch row does them. The add is the reference's (both operands in fp32, one rounding to the output's
dtype, to nearest even: rms_norm.round_to), and the rest only moves data, so the result equals the reference
exactly. (fp16 goes through Triton's conversion there: exact on a GPU; the interpreter truncates, so its CPU tests
cover fp32 and bf16.)

With `more_rows` it also sums the frame's embedding rows first (embed_frame: torch stacked the 16 rows and summed
them, ~8 us a step more): in fp32 in row order, rounded once to the rows' dtype. torch's reduction may add in
another order: in bf16 (16 rows add up exactly in fp32 unless their magnitudes lie far apart) that is nearly always
the same bits and otherwise one ulp; in fp32 the two differ by the ordering error of a 16-term sum.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to


@triton.jit
def _frame_input_kernel(embed_ptr, more_ptr, rows_ptr, fed_ptr, trailing_len_ptr, prompt_len_ptr, table_ptr,
                        pages_ptr, pad_ptr, out_ptr, pos_ptr, hidden_size, max_index,
                        stride_embed, stride_more, stride_more_row, stride_table, stride_page, stride_page_row,
                        stride_out, PAGE_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, MORE_ROWS: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    i = tl.program_id(0)
    slot = tl.load(rows_ptr + i)
    fed = tl.load(fed_ptr + i)
    tl.store(pos_ptr + i, tl.load(prompt_len_ptr + i) + fed)
    use_text = fed < tl.load(trailing_len_ptr + i)
    index = tl.minimum(fed, max_index)
    page = tl.load(table_ptr + slot * stride_table + index // PAGE_ROWS)
    text_row = pages_ptr + page * stride_page + (index % PAGE_ROWS) * stride_page_row
    for start in range(0, hidden_size, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        mask = cols < hidden_size
        text = tl.where(use_text, tl.load(text_row + cols, mask=mask), tl.load(pad_ptr + cols, mask=mask))
        e = tl.load(embed_ptr + i * stride_embed + cols, mask=mask).to(tl.float32)
        if MORE_ROWS > 0:
            # embed_frame's sum of the frame's rows: fp32, in row order, one rounding to the rows' dtype
            for k in range(1, MORE_ROWS + 1):
                e += tl.load(more_ptr + i * stride_more + k * stride_more_row + cols, mask=mask).to(tl.float32)
            e = round_to(e, dtype)
        # (round_to: to nearest even, as torch; the store's conversion is then exact, even in the interpreter)
        tl.store(out_ptr + i * stride_out + cols, round_to(e + text.to(tl.float32), dtype).to(dtype), mask=mask)


def frame_input(embed: torch.Tensor, rows: torch.Tensor, fed: torch.Tensor, trailing_len: torch.Tensor,
                prompt_len: torch.Tensor, text_table: torch.Tensor, text_pages: torch.Tensor, pad: torch.Tensor,
                more_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [B, H] = embed + (trailing-text row `fed` of slot rows[b], or pad past its trailing_len), positions [B]
    = prompt_len + fed). embed [B, H] (unit last stride), rows / fed / trailing_len / prompt_len [B] int64,
    text_table [slots, pages] int64, text_pages [pages, PAGE_ROWS, H] (embed's dtype), pad [H]. more_rows [B, R, H]
    (embed's dtype, unit last stride): embed is first the sum of embed and more_rows[:, 1:] (fp32, in row order,
    rounded once to the dtype; torch's sum of those rows may add in another order: see the module's note)."""
    b, hidden_size = embed.shape
    more = more_rows if more_rows is not None else embed
    assert more.dtype == embed.dtype and more.stride(-1) == 1 and more.device == embed.device
    assert more_rows is None or (more_rows.dim() == 3 and more_rows.shape[0] == b and more_rows.shape[2] == hidden_size)
    page_rows = text_pages.shape[1]
    assert embed.stride(1) == 1 and text_pages.stride(2) == 1 and text_table.stride(1) == 1
    assert text_pages.dtype == embed.dtype
    pad = pad.to(text_pages.dtype).contiguous()
    rows, fed, trailing_len, prompt_len = (t.contiguous() for t in (rows, fed, trailing_len, prompt_len))
    out = torch.empty(b, hidden_size, dtype=embed.dtype, device=embed.device)
    positions = torch.empty(b, dtype=torch.long, device=embed.device)
    _frame_input_kernel[(b,)](
        embed, more, rows, fed, trailing_len, prompt_len, text_table, text_pages, pad, out, positions, hidden_size,
        text_table.shape[1] * page_rows - 1, embed.stride(0), more.stride(0), more.stride(1) if more.dim() == 3 else 0,
        text_table.stride(0), text_pages.stride(0), text_pages.stride(1), out.stride(0), PAGE_ROWS=page_rows,
        BLOCK_H=min(1024, triton.next_power_of_2(hidden_size)),
        MORE_ROWS=0 if more_rows is None else more_rows.shape[1] - 1)
    return out, positions
