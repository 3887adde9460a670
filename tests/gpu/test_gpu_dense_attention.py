"""The code predictor's single-query attention kernel on CUDA vs eager attention at the real shapes (16 query
heads, 8 KV heads, head_dim 128, 1..16 keys), also captured in a CUDA graph."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("batch", [1, 64])
def test_dense_decode_attention_matches_eager(dtype, tol, batch):
    from voxflow.kernels.dense_decode_attention import dense_decode_attention
    from voxflow.layers.attention import eager_attention
    torch.backends.cuda.matmul.allow_tf32 = False
    for t in (1, 2, 9, 16):
        q = torch.randn(batch, 1, 16, 128, device="cuda").to(dtype).transpose(1, 2)
        k = torch.randn(batch, 8, t, 128, device="cuda", dtype=dtype)
        v = torch.randn(batch, 8, t, 128, device="cuda", dtype=dtype)
        want = eager_attention(q, k, v, None, 128 ** -0.5).float()
        got = dense_decode_attention(q, k, v, 128 ** -0.5).float()
        assert (got - want).abs().max().item() <= tol


def test_dense_decode_attention_in_a_cuda_graph():
    from voxflow.kernels.dense_decode_attention import dense_decode_attention
    from voxflow.layers.attention import eager_attention
    q = torch.randn(4, 16, 1, 128, device="cuda")
    k = torch.randn(4, 8, 12, 128, device="cuda")
    v = torch.randn(4, 8, 12, 128, device="cuda")
    dense_decode_attention(q, k, v, 0.1)                       # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dense_decode_attention(q, k, v, 0.1)
    q.normal_(), k.normal_(), v.normal_()
    graph.replay()
    assert (out - eager_attention(q, k, v, None, 0.1)).abs().max().item() <= 1e-5
