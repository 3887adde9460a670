"""On CUDA, RotaryEmbedding answers from its table: the same bits as computing per call, also in a CUDA graph."""
import pytest
import torch

from voxflow.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_rotary_table_on_cuda_is_bit_exact_and_capturable():
    emb = RotaryEmbedding(128, 1_000_000.0, max_positions=32768).cuda()
    positions = torch.randint(0, 32768, (64, 1), device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        got = emb(positions, dtype)
        want = emb._compute(positions, dtype)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cos, _ = emb(positions, torch.bfloat16)
    positions.random_(0, 32768)
    graph.replay()
    assert torch.equal(cos, emb._compute(positions, torch.bfloat16)[0])
