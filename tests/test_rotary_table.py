"""RoPE from a precomputed table (the GPU path) gives exactly the bits of computing it per call."""
import torch

from voxflow.layers.rotary import RotaryEmbedding


def test_rotary_table_lookup_is_bit_exact():
    emb = RotaryEmbedding(128, 1_000_000.0, max_positions=4096)
    positions = torch.tensor([[0, 1, 2, 3], [4095, 17, 2048, 999]])
    for dtype in (torch.float32, torch.bfloat16):
        cos_t, sin_t = emb._table(positions.device, dtype)
        cos, sin = emb._compute(positions, dtype)
        assert torch.equal(cos_t[positions], cos) and torch.equal(sin_t[positions], sin)
        assert cos_t.dtype == dtype and cos_t.shape == (4096, 128)
    # CPU calls keep computing directly (the table is a GPU launch-count saving)
    assert torch.equal(emb(positions, torch.float32)[0], emb._compute(positions, torch.float32)[0])
