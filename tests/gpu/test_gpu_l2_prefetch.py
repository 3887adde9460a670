"""The talker's one-row layer with part of gate|up's weights prefetched into L2 during its attention
(qwen3_layer.ONE_ROW_PREFETCH_MB, voxflow/kernels/l2_prefetch.py) on the GPU: the prefetch kernel runs where it
should (spied) and the layer's output has the same bits as without it, eager and replayed from a CUDA graph with
new inputs (a prefetch is a hint; the kernel's wait keeps the chain's order). Skipped without a Hopper-class GPU."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                reason="needs a CUDA GPU of compute capability >= 9 (run on the device machine)")


@torch.no_grad()
def test_one_row_layer_with_the_prefetch_gives_the_same_bits():
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import l2_prefetch
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    torch.manual_seed(0)
    layer = layer_mod.Qwen3DecoderLayer(2048, 6144, 16, 8, 128, 1e-6)
    for name, p in layer.named_parameters():
        p.data.uniform_(0.5, 1.5) if name.endswith("norm.weight") else p.data.normal_(0, p.shape[1] ** -0.5)
    layer = layer.to(device="cuda", dtype=torch.bfloat16).eval()
    cos, sin = (t[:, 5:6] for t in RotaryEmbedding(128, 1e6, 4096).to("cuda").prefix(16, torch.device("cuda"),
                                                                                      torch.bfloat16))
    x = torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16)
    prefixes = torch.randn(5, 1, 8, 16, 128, device="cuda", dtype=torch.bfloat16)

    def run():
        cache = StaticKVCache(1, 1, 8, 16, 128, torch.bfloat16, torch.device("cuda"))
        cache.layers[0].k.copy_(prefixes[0])
        cache.layers[0].v.copy_(prefixes[1])
        cache.layers[0].length = 5
        return layer(x, cos, sin, cache.layers[0], None)

    calls, real = [], l2_prefetch.prefetch_l2
    saved = layer_mod.ONE_ROW_PREFETCH_MB
    l2_prefetch.prefetch_l2 = lambda *a: (calls.append(a[1]), real(*a))[1]
    try:
        layer_mod.ONE_ROW_PREFETCH_MB = 0
        want = run().clone()
        assert not calls
        layer_mod.ONE_ROW_PREFETCH_MB = 16
        assert torch.equal(run(), want) and calls == [16 * 2 ** 20]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for _ in range(3):
            x.normal_()
            graph.replay()
            layer_mod.ONE_ROW_PREFETCH_MB = 0
            assert torch.equal(out, run())           # the replay (with the prefetch) == an eager pass without
            layer_mod.ONE_ROW_PREFETCH_MB = 16
    finally:
        layer_mod.ONE_ROW_PREFETCH_MB = saved
        l2_prefetch.prefetch_l2 = real
