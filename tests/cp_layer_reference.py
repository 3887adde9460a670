"""Inputs and torch references for the code predictor's fused layer kernels (voxflow/kernels/norm_linear.py,
attention_o_proj.py, cp_layer.py), shared by their CPU (interpreter) and GPU tests.

The references are the plain torch expressions of voxflow/layers (kernel switch off on CPU: call them on CPU
tensors, or with `set_kernels_enabled(False)` on CUDA), plus fp32 versions for the error bounds."""
from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6
# The 1.7B code predictor: hidden 1024, intermediate 3072, 16 q / 8 kv heads of 128, 16 cache positions.
REAL = dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128, cache=16)
# A tiny one with the same structure (2 q heads per kv head, attention output wider than the hidden size).
TINY = dict(hidden=64, inter=128, heads=4, kv_heads=2, head_dim=32, cache=16)


def rand(g, *shape, scale=1.0, device="cpu"):
    return torch.randn(*shape, generator=g, device=device) * scale


def norm_linear_inputs(m, n, k, dtype, swiglu, seed=0, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    x = rand(g, m, k, scale=3.0, device=device).to(dtype)
    w = rand(g, 2 * n if swiglu else n, k, scale=k ** -0.5, device=device).to(dtype)
    nw = (torch.rand(k, generator=g, device=device) + 0.5).to(dtype)
    return x, w, nw


def norm_linear_reference(x, w, nw, swiglu):
    """(same-dtype torch result: RMSNorm module math, F.linear, silu(gate) * up;
        fp32 result of the same math from the unrounded normed row, the error scale |a| @ |w|^T of it)."""
    from voxflow.layers.rms_norm import rms_norm
    a = rms_norm(x, nw, EPS)
    y = F.linear(a, w)
    x32 = x.float()
    a32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * nw.float()
    y32 = F.linear(a32, w.float())
    scale = F.linear(a32.abs(), w.float().abs())
    if swiglu:
        n = w.shape[0] // 2
        y = F.silu(y[:, :n]) * y[:, n:]
        g32, u32 = y32[:, :n], y32[:, n:]
        # |d(silu(g) u)| <= 1.1 |dg| |u| + |silu(g)| |du|, with |dg|, |du| bounded by their scales
        scale = 1.1 * scale[:, :n] * u32.abs() + F.silu(g32).abs() * scale[:, n:] + (F.silu(g32) * u32).abs()
        y32 = F.silu(g32) * u32
    return y, y32, scale


def attention_inputs(shape, m, length, dtype, seed=0, per_row_rope=False, device="cpu"):
    """Raw q|k|v rows, residual, W_o, q/k norm weights, cos / sin of position `length`, and caches [M, Hkv, L, D]
    whose positions >= length hold a sentinel (to see that nothing but position `length` is written)."""
    g = torch.Generator(device=device).manual_seed(seed)
    hq, hkv, d, n = shape["heads"], shape["kv_heads"], shape["head_dim"], shape["hidden"]
    qkv = rand(g, m, (hq + 2 * hkv) * d, scale=2.0, device=device).to(dtype)
    res = rand(g, m, n, scale=4.0, device=device).to(dtype)
    w_o = rand(g, n, hq * d, scale=(hq * d) ** -0.5, device=device).to(dtype)
    qw = (torch.rand(d, generator=g, device=device) + 0.5).to(dtype)
    kw = (torch.rand(d, generator=g, device=device) + 0.5).to(dtype)
    from voxflow.layers.rotary import RotaryEmbedding
    rot = RotaryEmbedding(d, 1e6, 64).to(device)
    pos = torch.arange(m, device=device)[:, None] + length if per_row_rope else torch.tensor([[length]], device=device)
    cos, sin = rot._compute(pos, dtype)
    k_cache = torch.full((m, hkv, shape["cache"], d), 7.0, dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, -7.0)
    k_cache[:, :, :length] = rand(g, m, hkv, length, d, device=device).to(dtype)
    v_cache[:, :, :length] = rand(g, m, hkv, length, d, device=device).to(dtype)
    return dict(qkv=qkv, residual=res, w_o=w_o, q_weight=qw, k_weight=kw, cos=cos, sin=sin, k_cache=k_cache,
                v_cache=v_cache, length=length, num_heads=hq, scale=d ** -0.5)


def attention_reference(a):
    """(out, out32, scale, keys [M, Hkv, length + 1, D], values): the torch layer's math (per-head RMSNorm module
    math, RoPE, attention in fp32 of the same-dtype values rounded once, as the dense kernels do, o_proj, residual)."""
    from voxflow.layers.attention import eager_attention
    from voxflow.layers.rms_norm import rms_norm
    from voxflow.layers.rotary import apply_rotary
    qkv, k_cache, length = a["qkv"], a["k_cache"], a["length"]
    m, (hkv, d) = qkv.shape[0], (k_cache.shape[1], k_cache.shape[3])
    hq = a["num_heads"]
    q = qkv[:, :hq * d].reshape(m, 1, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].reshape(m, 1, hkv, d)
    v = qkv[:, (hq + hkv) * d:].reshape(m, 1, hkv, d).transpose(1, 2)
    q = rms_norm(q, a["q_weight"], EPS).transpose(1, 2)
    k = rms_norm(k, a["k_weight"], EPS).transpose(1, 2)
    q, k = apply_rotary(q, k, a["cos"], a["sin"])
    keys = torch.cat((k_cache[:, :, :length], k), dim=2)
    values = torch.cat((a["v_cache"][:, :, :length], v), dim=2)
    att = eager_attention(q.float(), keys.float(), values.float(), None, a["scale"]).reshape(m, -1)
    att_r = att.to(qkv.dtype)
    out = a["residual"] + F.linear(att_r, a["w_o"])
    out32 = a["residual"].float() + F.linear(att_r.float(), a["w_o"].float())
    scale = F.linear(att_r.float().abs(), a["w_o"].float().abs()) + a["residual"].float().abs()
    return out, out32, scale, keys, values


def make_layer(shape, dtype, seed=0, device="cpu"):
    from voxflow.layers.qwen3_layer import Qwen3DecoderLayer
    torch.manual_seed(seed)
    layer = Qwen3DecoderLayer(shape["hidden"], shape["inter"], shape["heads"], shape["kv_heads"], shape["head_dim"],
                              EPS)
    for name, p in layer.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
        else:
            p.data.normal_(0, p.shape[1] ** -0.5)
    return layer.to(device=device, dtype=dtype).eval()


def make_code_predictor(dtype, device, seed=0, talker_hidden_size=2048):
    """The 1.7B code predictor (5 layers, hidden 1024, talker hidden 2048) with scaled random weights, for the GPU
    tests that run `CodePredictor.predict` with the fused paths on and off (talker_hidden_size 1024: the 0.6B's,
    no projection)."""
    from voxflow.models.qwen3_tts.code_predictor import CodePredictor
    from voxflow.models.qwen3_tts.config import CodePredictorConfig
    cfg = CodePredictorConfig(hidden_size=REAL["hidden"], intermediate_size=REAL["inter"], num_hidden_layers=5,
                              num_attention_heads=REAL["heads"], num_key_value_heads=REAL["kv_heads"],
                              head_dim=REAL["head_dim"], rms_norm_eps=EPS, rope_theta=1e6,
                              max_position_embeddings=65536, vocab_size=2048, num_code_groups=16)
    torch.manual_seed(seed)
    cp = CodePredictor(cfg, talker_hidden_size=talker_hidden_size)
    for name, p in cp.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
        elif p.dim() == 2:
            p.data.normal_(0, p.shape[1] ** -0.5)
    return cp.to(device=device, dtype=dtype).eval()


def make_cache(shape, m, length, dtype, seed=0, device="cpu"):
    """A StaticLayerKVCache of `m` rows with `length` random positions filled."""
    from voxflow.layers.static_kv_cache import StaticLayerKVCache
    g = torch.Generator(device=device).manual_seed(seed)
    cache = StaticLayerKVCache(m, shape["kv_heads"], shape["cache"], shape["head_dim"], dtype, torch.device(device))
    cache.k.fill_(7.0)
    cache.v.fill_(-7.0)
    cache.k[:, :, :length] = rand(g, m, shape["kv_heads"], length, shape["head_dim"], device=device).to(dtype)
    cache.v[:, :, :length] = rand(g, m, shape["kv_heads"], length, shape["head_dim"], device=device).to(dtype)
    cache.length = length
    return cache


def clone_cache(cache):
    from voxflow.layers.static_kv_cache import StaticLayerKVCache
    c = StaticLayerKVCache.__new__(StaticLayerKVCache)
    c.k, c.v, c.length = cache.k.clone(), cache.v.clone(), cache.length
    return c
