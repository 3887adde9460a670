"""The row gather / scatter kernels (voxflow/kernels/row_copy.py) against index_select / index_copy_, and the codec
pool's packed rows through them (CPU: Triton's interpreter in a subprocess, since TRITON_INTERPRET must be set before
triton is first imported). A copy: bit-equal."""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_ROW_COPY_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def check_against_the_index_ops():
    from voxflow.kernels.row_copy import _BLOCK, gather_rows, scatter_rows
    g = torch.Generator().manual_seed(0)
    # widths: one element, a row of two blocks (the last partial), a row of exactly one block
    for n in (1, _BLOCK + 904, _BLOCK):
        for dtype in (torch.float16, torch.float32, torch.int64):
            buf = (torch.randn(7, n, generator=g) * 100).to(dtype)
            for rows in (torch.tensor([3, 0, 6, 3]), torch.tensor([5, 1], dtype=torch.int32)):
                got = gather_rows(buf, rows)
                assert torch.equal(got, buf.index_select(0, rows)), (n, dtype, rows)
            distinct = torch.tensor([4, 0, 2])
            src = (torch.randn(3, n, generator=g) * 100).to(dtype)
            want = buf.clone().index_copy_(0, distinct, src)
            scatter_rows(buf, distinct, src)
            assert torch.equal(buf, want), (n, dtype)
            # one row written to several (a stride-0 source, as a reset writes the initial state)
            one = (torch.randn(1, n, generator=g) * 100).to(dtype)
            scatter_rows(buf, torch.tensor([1, 6]), one.expand(2, -1))
            assert torch.equal(buf[1], one[0]) and torch.equal(buf[6], one[0]) and torch.equal(buf[4], src[0])
    buf = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="contiguous rows"):
        gather_rows(buf.t(), torch.tensor([0]))
    with pytest.raises(ValueError, match="row numbers"):
        gather_rows(buf, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="contiguous 1-D"):          # a strided index would be read wrongly
        gather_rows(buf, torch.tensor([0, 9, 1, 9])[::2])
    with pytest.raises(ValueError, match="src must be"):
        scatter_rows(buf, torch.tensor([0, 1]), torch.zeros(2, 7))


def check_the_codec_pools_rows_through_the_kernels():
    """PackedRows' gather / write / fill with the kernels taken (as on a GPU): the same rows as the index ops."""
    from voxflow.kernels import row_copy
    from voxflow.models.qwen3_tts import codec_pool
    g = torch.Generator().manual_seed(1)
    template = {"a": torch.randn(1, 3, 5, generator=g).half(), "pos": torch.tensor([7]),
                "b": torch.randn(1, 300, generator=g).half()}
    new = {"a": torch.randn(2, 3, 5, generator=g).half(), "pos": torch.tensor([1, 2]),
           "b": torch.randn(2, 300, generator=g).half()}
    results, calls = [], []
    taken, gather, scatter = codec_pool.use_kernels, row_copy.gather_rows, row_copy.scatter_rows
    row_copy.gather_rows = lambda *a: calls.append("gather") or gather(*a)
    row_copy.scatter_rows = lambda *a: calls.append("scatter") or scatter(*a)
    try:
        for kernels in (False, True):
            codec_pool.use_kernels = lambda t, on=kernels: on
            packed = codec_pool.PackedRows(template, 4)
            packed.write(torch.tensor([2, 0]), new)
            packed.fill(torch.tensor([3]), codec_pool.PackedRows(template, 1).flat)
            results.append(({k: v.clone() for k, v in packed.tensors.items()}, packed.gather(torch.tensor([3, 2]))))
    finally:
        codec_pool.use_kernels, row_copy.gather_rows, row_copy.scatter_rows = taken, gather, scatter
    # the kernels ran in the second pass only: per dtype (fp16, int64) a scatter for the write and the fill and
    # one gather; the template's own row and the pool's initial rows are made without them
    assert sorted(calls) == ["gather"] * 2 + ["scatter"] * 4, calls
    (want_all, want_rows), (got_all, got_rows) = results
    for k in template:
        assert torch.equal(got_all[k], want_all[k]) and torch.equal(got_rows[k], want_rows[k]), k
    assert torch.equal(got_rows["pos"], torch.tensor([7, 1])) and torch.equal(got_all["a"][1], template["a"][0])


def check_the_paged_kv_write_through_the_kernel():
    """PagedKVView.write(kernel=True) (a packed prefill's K/V into its pages, as on a GPU) stores what the index_put
    path stores: bf16 and fp8 pools (saturated), a new k/v whose rows are strided (a slice of a fused projection)."""
    from voxflow.engine.model_api import PagedKVContext
    from voxflow.layers.paged_attention import FP8_KV, PagedKVView
    g = torch.Generator().manual_seed(2)
    tokens, hkv, d, bs = 11, 2, 8, 4
    # a column of a wider table (strided slots)
    slots = torch.stack([torch.randperm(6 * bs, generator=g)[:tokens] for _ in range(3)], 1)[:, 1:2]
    for dtype in (torch.bfloat16, FP8_KV):
        pools = [torch.randn(6, bs, hkv, d, generator=g).to(dtype) for _ in range(2)]
        kv = PagedKVContext(k_cache=[pools[0]], v_cache=[pools[1]], block_tables=torch.zeros(tokens, 1,
                            dtype=torch.int32), context_lens=torch.ones(tokens, dtype=torch.int32), block_size=bs,
                            slot_mapping=slots)
        view = PagedKVView(kv, 1)
        wide = torch.randn(tokens, 1, 3 * hkv, d, generator=g).bfloat16() * 300    # |x| > 448 too: saturated
        new = wide[:, :, hkv:2 * hkv].transpose(1, 2)                               # [B, Hkv, 1, D], strided rows
        every_other = torch.randn(tokens, hkv, 1, 2 * d, generator=g).bfloat16()[..., ::2]    # head dim strided
        for source in (new, every_other):
            want, got = pools[0].clone(), pools[0].clone()
            view.write(want, source)
            view.write(got, source, kernel=True)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), dtype
            assert not torch.equal(got.view(torch.uint8), pools[0].view(torch.uint8)), dtype      # it wrote


if IN_CHILD:
    def test_child_against_the_index_ops():
        check_against_the_index_ops()

    def test_child_the_paged_kv_write_through_the_kernel():
        check_the_paged_kv_write_through_the_kernel()

    def test_child_the_codec_pools_rows_through_the_kernels():
        check_the_codec_pools_rows_through_the_kernels()
else:
    def test_row_copy_kernels_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
