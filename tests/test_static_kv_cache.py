"""The code predictor's preallocated KV cache (reference path, CPU) gives exactly what the growing cache does."""
import torch

from voxflow.layers.attention import KVCache, attention_bias, eager_attention
from voxflow.layers.static_kv_cache import StaticKVCache


def test_static_cache_matches_the_growing_cache_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, d = 3, 4, 2, 16
    static = StaticKVCache(2, b, hkv, 16, d, torch.float32, torch.device("cpu"))
    growing = KVCache(2)
    steps = [2] + [1] * 14                              # the code predictor: a 2-token prefill, then 14 single steps
    for s in steps:
        past = static.seq_len
        assert past == growing.seq_len
        bias = attention_bias(s, past + s, None, batch=b, dtype=torch.float32, device="cpu")
        for layer in range(2):
            q = torch.randn(b, hq, s, d, generator=g)
            k = torch.randn(b, hkv, s, d, generator=g)
            v = torch.randn(b, hkv, s, d, generator=g)
            got = static[layer].attend(q, k, v, bias, d ** -0.5)
            keys, values = growing[layer].append(k, v)
            want = eager_attention(q, keys, values, bias, d ** -0.5)
            assert torch.equal(got, want)
    assert static.seq_len == 16 and len(static) == 2


def test_static_cache_refuses_to_overflow():
    cache = StaticKVCache(1, 1, 1, 2, 16, torch.float32, torch.device("cpu"))
    x = torch.zeros(1, 1, 2, 16)
    cache[0].attend(x, x, x, None, 1.0)
    try:
        cache[0].attend(x[:, :, :1], x[:, :, :1], x[:, :, :1], None, 1.0)
    except ValueError as e:
        assert "cannot take 3" in str(e)
    else:
        raise AssertionError("a third position was accepted by a 2-position cache")
