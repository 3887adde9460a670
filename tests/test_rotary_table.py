"""RoPE from a precomputed table (the GPU path: cos and sin side by side, one gather a call) gives exactly the bits
of computing it per call."""
import torch

from voxflow.layers.rotary import RotaryEmbedding


def test_rotary_table_lookup_is_bit_exact():
    emb = RotaryEmbedding(128, 1_000_000.0, max_positions=4096)
    positions = torch.tensor([[0, 1, 2, 3], [4095, 17, 2048, 999]])
    for dtype in (torch.float32, torch.bfloat16):
        table = emb._table(positions.device, dtype)
        cos, sin = emb._compute(positions, dtype)
        assert table.dtype == dtype and table.shape == (2, 4096, 128)
        got_cos, got_sin = emb.lookup(table, positions)          # what forward returns on a GPU: one gather
        assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)
        assert got_cos.is_contiguous() and got_sin.is_contiguous()
        pre_cos, pre_sin = emb.prefix(16, positions.device, dtype)    # (computed on a CPU; views on a GPU)
        assert torch.equal(pre_cos[0], table[0, :16]) and torch.equal(pre_sin[0], table[1, :16])
    # CPU calls keep computing directly (the table is a GPU launch-count saving)
    assert torch.equal(emb(positions, torch.float32)[0], emb._compute(positions, torch.float32)[0])
