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


def test_folding_in_place_keeps_the_layer_and_hands_out_its_own_weights():
    """fold_norms_in_place (the talker's fold, FOLDED_NORMS_PAGED, on a GPU at load): the plain layer computes what
    it did (fp32: within 1e-5 of the output's scale), the norm weights are ones, the q/k/v and gate/up Linears see
    the folded weights (views of the fused tensors), and folded_weights returns those tensors themselves, no copy."""
    from voxflow.layers.rotary import RotaryEmbedding
    lay = layer()
    x = torch.randn(2, 3, 32)
    cos, sin = RotaryEmbedding(8, 10000.0)(torch.arange(3).expand(2, 3), x.dtype)
    before = lay(x, cos, sin, None, None)
    g = lay.input_layernorm.weight.clone()
    q_before = lay.self_attn.q_proj.weight.clone()
    fn.fold_norms_in_place(lay)
    after = lay(x, cos, sin, None, None)
    assert not torch.equal(after, before)                        # the roundings moved: a real change of weights
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5 * before.abs().max().item())
    assert torch.equal(lay.input_layernorm.weight, torch.ones(32))
    assert torch.equal(lay.post_attention_layernorm.weight, torch.ones(32))
    torch.testing.assert_close(lay.self_attn.q_proj.weight, q_before * g[None, :])
    qkv, gate_up = fn.folded_weights(lay)
    assert qkv.data_ptr() == lay.self_attn.fused_qkv().data_ptr()
    assert gate_up.data_ptr() == lay.mlp.fused_gate_up().data_ptr()


def test_which_folded_steps_take_the_skinny_gemms(monkeypatch):
    """qwen3_layer._folded_skinny: CP_SKINNY_GEMMS for the code predictor's cache (it attends raw projections),
    TALKER_SKINNY_GEMMS for the talker's paged view; True always, "auto" only where the kernels launch with PDL,
    False never; never above skinny_linear's 64 rows."""
    import types

    from voxflow.kernels import skinny_linear as sk
    from voxflow.layers import qwen3_layer as ql
    assert ql.MAX_SKINNY_GEMM_ROWS == sk.MAX_M
    cp_cache, talker_view = types.SimpleNamespace(attend_raw=object()), types.SimpleNamespace(attend=object())
    rows = {m: torch.zeros(m, 8) for m in (1, 9, 64, 65)}
    pdl = [False]
    monkeypatch.setattr(ql, "use_pdl", lambda t: pdl[0])
    for cp_switch, talker_switch in ((True, False), ("auto", True), (False, "auto")):
        monkeypatch.setattr(ql, "CP_SKINNY_GEMMS", cp_switch)
        monkeypatch.setattr(ql, "TALKER_SKINNY_GEMMS", talker_switch)
        for pdl[0] in (False, True):
            for cache, switch in ((cp_cache, cp_switch), (talker_view, talker_switch)):
                want = switch is True or (switch == "auto" and pdl[0])
                assert [ql._folded_skinny(cache, rows[m]) for m in (1, 9, 64, 65)] == [want, want, want, False]
