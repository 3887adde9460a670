"""voxflow/layers/folded_norms.py on the CPU: the fold is the norm's weight moved into the GEMM (RMSNorm(x) @ W^T ==
r * (x @ (W * g)^T) up to fp32 rounding), and the folded copies a layer keeps are made again whenever a weight they
come from changes, through the fused tensor or through one Linear's own view of it, and only then. (The kernels
that apply the row factor, and the folded layer path, have their interpreter tests beside the kernels':
tests/test_kernel_dense_attention.py, tests/test_kernels_elementwise.py, tests/test_kernel_code_predictor_path.py.)"""
import torch

from voxflow.layers import folded_norms as fn
from voxflow.layers.qwen3_layer import Qwen3DecoderLayer
from voxflow.layers.rms_norm import rms_norm


def layer():
    torch.manual_seed(0)
    lay = Qwen3DecoderLayer(32, 48, 4, 2, 8, 1e-6).requires_grad_(False)
    lay.input_layernorm.weight.uniform_(0.5, 1.5)
    lay.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return lay


def test_fold_moves_the_norm_weight_into_the_gemm():
    lay = layer()
    x = torch.randn(5, 32, dtype=torch.float64)
    w = lay.self_attn.q_proj.weight.double()
    g = lay.input_layernorm.weight.double()
    want = rms_norm(x, g, 1e-6) @ w.T
    got = fn.row_factor(x, 1e-6) * (x @ fn.fold_norm(w, g).T)     # (fold_norm's product is fp32)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # scale_rows is that factor applied to a GEMM output, rounded to its dtype
    out = (x @ fn.fold_norm(w, g).T).float()
    torch.testing.assert_close(fn.scale_rows(out, x, 1e-6).double(), want, rtol=1e-6, atol=1e-6)


def test_folded_weights_are_kept_and_made_again_when_a_source_weight_changes():
    lay = layer()
    qkv_f, gate_up_f = fn.folded_weights(lay)
    assert fn.folded_weights(lay)[0] is qkv_f                     # kept while nothing changed
    g = lay.input_layernorm.weight
    nq = lay.self_attn.q_proj.out_features
    torch.testing.assert_close(qkv_f, lay.self_attn.fused_qkv() * g[None, :])
    with torch.no_grad():
        lay.self_attn.q_proj.weight.mul_(2.0)                     # in place through one Linear's view
    again = fn.folded_weights(lay)[0]
    assert again is not qkv_f
    torch.testing.assert_close(again[:nq], 2.0 * qkv_f[:nq])
    torch.testing.assert_close(again[nq:], qkv_f[nq:])
    with torch.no_grad():
        lay.post_attention_layernorm.weight.fill_(1.0)            # a norm weight
    assert torch.equal(fn.folded_weights(lay)[1], lay.mlp.fused_gate_up())
    with torch.no_grad():
        lay.mlp.up_proj.weight.zero_()
    inter = lay.mlp.gate_proj.out_features
    assert not fn.folded_weights(lay)[1][inter:].any() and fn.folded_weights(lay)[1][:inter].any()
    assert not torch.equal(gate_up_f, fn.folded_weights(lay)[1])
