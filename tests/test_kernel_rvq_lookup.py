"""The codec's residual dequantisation in one kernel (voxflow/kernels/rvq_lookup.py) against the reference's K
lookups and adds (codec_decoder_blocks.ResidualDequantizer), bit for bit (CPU: Triton's interpreter in a subprocess,
since TRITON_INTERPRET must be set before triton is first imported)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_RVQ_LOOKUP_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def reference(codes, table):
    total = 0
    for k in range(table.shape[0]):
        total = total + F.embedding(codes[:, k], table[k])
    return total


def check_against_the_reference_sum():
    from voxflow.kernels.rvq_lookup import rvq_lookup
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for k, size, dim in ((15, 64, 40), (1, 32, 256), (3, 16, 1100)):       # dim over one 1024 block: two
            table = (torch.randn(k, size, dim, generator=g) * 3).to(dtype)
            every = torch.randint(0, size, (2, k + 1, 5), generator=g)
            codes = every[:, 1:]                                             # strided, as the split's slice
            got = rvq_lookup(codes, table)
            want = reference(codes, table)
            assert got.shape == (2, 5, dim) and got.dtype == dtype
            assert torch.equal(got, want), (dtype, k, size, dim)
            if k > 1 and dtype != torch.float32:                # the order matters: a one-rounding sum differs
                assert not torch.equal(got, table.float()[torch.arange(k)[:, None, None], codes.transpose(0, 1)]
                                       .sum(0).to(dtype))
    with pytest.raises(ValueError, match="contiguous"):
        rvq_lookup(torch.zeros(1, 2, 3, dtype=torch.long), torch.zeros(3, 4, 5))


def check_the_dequantizer_through_the_kernel():
    """SplitDequantizer (1 semantic + 15 acoustic codebooks, the 12 Hz codec's) with the kernel taken, as on a GPU:
    the plain path's bits, and the stacked table kept per weight version."""
    from voxflow.kernels import rvq_lookup
    from voxflow.models.qwen3_tts import codec_decoder_blocks as blocks
    torch.manual_seed(1)
    deq = blocks.SplitDequantizer(16, 1, 64, 24, 48).half().requires_grad_(False)
    for p in deq.parameters():
        p.data.uniform_(0.5, 2.0)
    codes = torch.randint(0, 64, (3, 16, 4))
    want = deq(codes)
    calls = []
    lookup, taken = rvq_lookup.rvq_lookup, blocks.use_kernels
    rvq_lookup.rvq_lookup = lambda *a: calls.append(1) or lookup(*a)
    blocks.use_kernels = lambda t: True
    try:
        got = deq(codes)
        table = deq.rvq_rest.table()
        assert deq.rvq_rest.table() is table and table.shape == (15, 64, 24)
        deq.rvq_rest.vq.layers[3]._codebook.embedding_sum.mul_(2)              # a weight changed in place
        assert deq.rvq_rest.table() is not table
    finally:
        rvq_lookup.rvq_lookup, blocks.use_kernels = lookup, taken
    assert len(calls) == 2 and torch.equal(got, want) and want.abs().max() > 0.1


if IN_CHILD:
    def test_child_against_the_reference_sum():
        check_against_the_reference_sum()

    def test_child_the_dequantizer_through_the_kernel():
        check_the_dequantizer_through_the_kernel()
else:
    def test_rvq_lookup_kernel_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
