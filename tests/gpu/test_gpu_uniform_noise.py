"""The fused noise kernel on CUDA == the int64 torch reference, bit for bit, also inside a CUDA graph."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_uniform_noise_kernel_bit_exact_on_cuda():
    from voxflow.kernels.uniform_noise import uniform_noise as fused
    from voxflow.models.qwen3_tts import batch_sampling
    keys = torch.randint(0, 2 ** 32, (64,), dtype=torch.long, device="cuda")
    frames = torch.randint(0, 2 ** 40, (64,), dtype=torch.long, device="cuda")
    for cb, vocab in ((0, 3072), (7, 2048)):
        want = batch_sampling.uniform_noise(keys.cpu(), frames.cpu(), cb, vocab)     # CPU: the torch reference
        assert torch.equal(fused(keys, frames, cb, vocab).cpu(), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused(keys, frames, 3, 2048)
    frames.add_(1)
    graph.replay()
    assert torch.equal(out.cpu(), batch_sampling.uniform_noise(keys.cpu(), frames.cpu(), 3, 2048))
