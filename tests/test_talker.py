"""Talker, code predictor and the shared Qwen3 layers (tiny random weights, CPU, fp32)."""
from __future__ import annotations

import os

import pytest
import torch

from voxflow.layers.attention import KVCache, attention_bias, eager_attention
from voxflow.layers.rms_norm import rms_norm
from voxflow.layers.rotary import RotaryEmbedding, apply_rotary
from voxflow.models.qwen3_tts.config import CodePredictorConfig, TalkerConfig, load_configs
from voxflow.models.qwen3_tts.talker import Talker, positions_from_mask
from voxflow.models.qwen3_tts.weights import WeightLoadError, load_into, read_safetensors, split_prefix

torch.set_num_threads(1)
ATOL = 1e-5


def tiny_config(hidden=32, cp_hidden=16) -> TalkerConfig:
    cp = CodePredictorConfig(hidden_size=cp_hidden, intermediate_size=2 * cp_hidden, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                             rope_theta=1e6, max_position_embeddings=65536, vocab_size=2048, num_code_groups=16)
    return TalkerConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                        rope_theta=1e6, max_position_embeddings=32768, vocab_size=3072,
                        text_vocab_size=100, text_hidden_size=24, code_predictor=cp)


def make_talker(hidden=32, cp_hidden=16, seed=0) -> Talker:
    torch.manual_seed(seed)
    t = Talker(tiny_config(hidden, cp_hidden)).eval()
    with torch.no_grad():  # norms start at 1.0; randomise them so a wrong norm placement shows up
        for name, p in t.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return t


@pytest.fixture(scope="module")
def talker():
    return make_talker()


def greedy(logits, j):
    return logits.argmax(-1)


# ---- structure / loading -------------------------------------------------------------------------
def test_state_dict_keys_follow_checkpoint_layout():
    keys = set(make_talker().state_dict())
    assert {"model.norm.weight", "model.codec_embedding.weight", "model.text_embedding.weight",
            "text_projection.linear_fc1.weight", "text_projection.linear_fc1.bias",
            "text_projection.linear_fc2.weight", "text_projection.linear_fc2.bias", "codec_head.weight",
            "model.layers.1.self_attn.q_norm.weight", "model.layers.0.mlp.down_proj.weight",
            "code_predictor.model.norm.weight", "code_predictor.model.codec_embedding.14.weight",
            "code_predictor.lm_head.14.weight", "code_predictor.small_to_mtp_projection.weight",
            "code_predictor.small_to_mtp_projection.bias",
            "code_predictor.model.layers.1.post_attention_layernorm.weight"} <= keys
    assert not any("rotary" in k or "inv_freq" in k for k in keys)
    assert "code_predictor.model.codec_embedding.15.weight" not in keys
    # equal widths: Identity projection, no weights (the 0.6B layout)
    same = set(make_talker(hidden=32, cp_hidden=32).state_dict())
    assert not any("small_to_mtp_projection" in k for k in same)


def test_shapes_of_projections(talker):
    sd = talker.state_dict()
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 16, 32)   # head_dim * heads != hidden
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 32)
    assert sd["code_predictor.model.codec_embedding.0.weight"].shape == (2048, 32)  # talker width
    assert sd["code_predictor.lm_head.0.weight"].shape == (2048, 16)
    assert sd["code_predictor.small_to_mtp_projection.weight"].shape == (16, 32)


def test_load_into_round_trip_and_strictness(talker):
    fresh = make_talker(seed=1)
    load_into(fresh, dict(talker.state_dict()), what="talker")
    x = torch.randn(1, 4, 32)
    pos = torch.arange(4)[None]
    assert torch.equal(fresh(x, pos), talker(x, pos))
    broken = dict(talker.state_dict())
    broken.pop("code_predictor.lm_head.3.weight")
    with pytest.raises(WeightLoadError):
        load_into(make_talker(), broken, what="talker")


# The tiny set (tests/conftest.py): custom_voice has a Linear projection, custom_voice_1b7 an Identity one.
@pytest.mark.parametrize("variant", ["custom_voice", "voice_design", "base", "custom_voice_1b7"])
def test_strict_load_of_tiny_checkpoint(variant):
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if not root:
        pytest.skip("VOXFLOW_TINY_DIR is not set (folder with tiny checkpoints in the official layout)")
    folder = os.path.join(root, variant)
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} does not exist")
    cfg, _, _ = load_configs(folder)
    t = Talker(cfg.talker).eval()
    tensors = split_prefix(read_safetensors(os.path.join(folder, "model.safetensors"), "talker."), "talker.")
    load_into(t, tensors, what="talker", prefix="talker.")
    for k, v in t.state_dict().items():
        assert torch.equal(v, tensors[k]), k
    h = t(t.embed_codec(torch.tensor([[2149, 5, 6]])), torch.arange(3)[None])
    codes, logits = t.predict_residual_codes(h[:, -1], torch.tensor([5]), greedy)
    assert codes.shape == (1, 15) and logits.shape == (1, 15, 2048)


# ---- decoder -------------------------------------------------------------------------------------
def test_incremental_decode_equals_full_forward(talker):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 10, 32, generator=g)
    pos = torch.arange(10).expand(2, 10)
    full = talker(x, pos)
    cache = talker.new_cache()
    parts = [talker(x[:, :6], pos[:, :6], cache)]
    for i in range(6, 10):
        parts.append(talker(x[:, i:i + 1], pos[:, i:i + 1], cache))
    assert cache.seq_len == 10
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=ATOL, rtol=0)


def test_left_padding_does_not_change_a_row(talker):
    g = torch.Generator().manual_seed(2)
    short = torch.randn(1, 5, 32, generator=g)
    long = torch.randn(1, 8, 32, generator=g)
    steps = torch.randn(2, 3, 32, generator=g)
    # alone, unpadded
    alone = []
    for row, x in ((0, short), (1, long)):
        cache = talker.new_cache()
        out = [talker(x, torch.arange(x.shape[1])[None], cache)[:, -1]]
        for k in range(3):
            out.append(talker(steps[row:row + 1, k:k + 1], torch.tensor([[x.shape[1] + k]]), cache)[:, -1])
        alone.append(torch.cat(out))
    # together, the short row left-padded with garbage
    padded = torch.cat([torch.cat([torch.randn(1, 3, 32, generator=g) * 100, short], 1), long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8])
    pos = positions_from_mask(mask)
    assert pos[0].tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    cache = talker.new_cache()
    out = [talker(padded, pos, cache, mask)[:, -1]]
    for k in range(3):
        mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
        p = positions_from_mask(mask)[:, -1:]
        assert p[:, 0].tolist() == [5 + k, 8 + k]
        out.append(talker(steps[:, k:k + 1], p, cache, mask)[:, -1])
    together = torch.stack(out, 1)
    assert torch.isfinite(together).all()
    for row in range(2):
        torch.testing.assert_close(together[row], alone[row], atol=ATOL, rtol=0)


def test_embeddings(talker):
    ids = torch.tensor([[3, 99]])
    emb = talker.embed_text(ids)
    manual = talker.text_projection.linear_fc2(
        torch.nn.functional.silu(talker.text_projection.linear_fc1(talker.model.text_embedding.weight[ids])))
    torch.testing.assert_close(emb, manual)
    codes = torch.randint(0, 2048, (3, 16))
    frame = talker.embed_frame(codes)
    manual = talker.model.codec_embedding.weight[codes[:, 0]] + sum(
        talker.code_predictor.model.codec_embedding[g - 1].weight[codes[:, g]] for g in range(1, 16))
    assert frame.shape == (3, 32)
    torch.testing.assert_close(frame, manual, atol=ATOL, rtol=0)
    assert talker.codec_logits(frame).shape == (3, 3072)


# ---- code predictor ------------------------------------------------------------------------------
@pytest.mark.parametrize("cp_hidden", [16, 32])
def test_code_predictor_matches_uncached_teacher_forcing(cp_hidden):
    t = make_talker(cp_hidden=cp_hidden)
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 32, generator=g)
    c0 = torch.tensor([7, 2047])
    seen_j = []

    def sample_fn(logits, j):
        assert logits.shape == (2, 2048)
        seen_j.append(j)
        return torch.randint(0, 2048, (2,), generator=g)

    codes, logits = t.predict_residual_codes(h, c0, sample_fn)
    assert seen_j == list(range(15))
    assert codes.shape == (2, 15) and codes.dtype == torch.long and logits.shape == (2, 15, 2048)
    # One uncached pass over all 16 inputs [h, E0(c0), E1(c1), ..., E14(c14)] at positions 0..15:
    cp = t.code_predictor
    seq = torch.cat([h[:, None], t.embed_codec(c0)[:, None], cp.embed_residual(codes)[:, :-1]], 1)
    hidden = cp(seq, torch.arange(16).expand(2, 16))
    expect = torch.stack([cp.lm_head[j](hidden[:, j + 1]) for j in range(15)], 1)
    torch.testing.assert_close(logits, expect, atol=ATOL, rtol=0)


def test_code_predictor_greedy_is_deterministic_and_batch_independent(talker):
    g = torch.Generator().manual_seed(4)
    h = torch.randn(3, 32, generator=g)
    c0 = torch.tensor([1, 2, 3])
    a_codes, a_logits = talker.predict_residual_codes(h, c0, greedy)
    b_codes, b_logits = talker.predict_residual_codes(h, c0, greedy)
    assert torch.equal(a_codes, b_codes) and torch.equal(a_logits, b_logits)
    assert torch.equal(a_codes, a_logits.argmax(-1))
    one_codes, one_logits = talker.predict_residual_codes(h[1:2], c0[1:2], greedy)
    assert torch.equal(one_codes, a_codes[1:2])
    torch.testing.assert_close(one_logits, a_logits[1:2], atol=ATOL, rtol=0)


# ---- layers --------------------------------------------------------------------------------------
def test_rms_norm_casts_back_before_the_weight():
    x = (torch.randn(4, 64) * 3).to(torch.bfloat16)
    w = torch.rand(64, dtype=torch.bfloat16) + 0.5
    x32 = x.float()
    expect = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6), expect)


def test_rope_depends_only_on_relative_position():
    rope = RotaryEmbedding(16, 1e6)
    q = torch.randn(1, 1, 1, 16)
    k = torch.randn(1, 1, 1, 16)

    def score(pq, pk):
        cq, sq = rope(torch.tensor([[pq]]), torch.float32)
        ck, sk = rope(torch.tensor([[pk]]), torch.float32)
        return (apply_rotary(q, q, cq, sq)[0] * apply_rotary(k, k, ck, sk)[1]).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100), atol=1e-4, rtol=0)
    assert not torch.allclose(score(7, 3), score(7, 6), atol=1e-3)
    cos, sin = rope(torch.zeros(1, 1, dtype=torch.long), torch.float32)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))


def test_attention_bias_and_fully_masked_rows_stay_finite():
    bias = attention_bias(3, 5, torch.tensor([[0, 1, 1, 1, 1]]), batch=1, dtype=torch.float32, device="cpu")
    allowed = (bias == 0)[0, 0]
    assert allowed.tolist() == [[False, True, True, False, False],
                                [False, True, True, True, False],
                                [False, True, True, True, True]]
    assert attention_bias(1, 5, None, batch=2, dtype=torch.float32, device="cpu") is None
    q = torch.randn(1, 4, 2, 8)
    k = torch.randn(1, 2, 2, 8)
    v = torch.randn(1, 2, 2, 8)
    bias = attention_bias(2, 2, torch.tensor([[0, 1]]), batch=1, dtype=torch.float32, device="cpu")
    out = eager_attention(q, k, v, bias, 8 ** -0.5)
    assert torch.isfinite(out).all()
    # the real query (slot 1) sees only the real key: output = v of kv head h // 2
    torch.testing.assert_close(out[0, 1], v[0, [0, 0, 1, 1], 1])


def test_kv_cache_select_rows():
    cache = KVCache(2)
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 4)
    cache[0].append(k, k)
    cache[1].append(k, k)
    cache.select_rows(torch.tensor([2, 0]))
    assert cache.seq_len == 2 and cache[1].k[:, 0, 0, 0].tolist() == [2.0, 0.0]


@pytest.mark.parametrize("cp_hidden", [16, 32])          # with and without the projection to the predictor
def test_frame_embedding_from_the_code_predictor_pass_equals_embed_frame(cp_hidden):
    """predict_residual_codes(frame_embed=True) gives embed_frame of the completed frame bit for bit (the same
    lookups, stacked in the same order and summed), and the same codes."""
    t = make_talker(cp_hidden=cp_hidden, seed=3)
    g = torch.Generator().manual_seed(4)
    h = torch.randn(3, 32, generator=g)
    c0 = torch.tensor([1, 7, 2047])
    codes, _ = t.predict_residual_codes(h, c0, greedy)
    codes_again, frame_embed = t.predict_residual_codes(h, c0, greedy, frame_embed=True)
    assert torch.equal(codes_again, codes)
    assert torch.equal(frame_embed, t.embed_frame(torch.cat((c0[:, None], codes), dim=1)))


def test_codec_head_takes_the_skinny_gemm_on_the_kernel_path(monkeypatch):
    """talker.SKINNY_CODEC_HEAD: one row of the decode step's head through skinny_linear; qwen3_layer.SKINNY_HEADS:
    2..64 rows (True always, "auto" only where the kernels launch with PDL); otherwise, and off the kernel path,
    through the nn.Linear. Spied here (its numerics are tests/test_kernel_skinny_linear.py's); the logits equal the
    head's either way."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.talker as talker_mod
    from voxflow.kernels import skinny_linear as sk
    t = make_talker()
    calls = []

    def spy(x, w, **kw):
        calls.append(tuple(x.shape))
        assert kw.get("residual") is None and w is t.codec_head.weight
        return torch.nn.functional.linear(x, w)
    monkeypatch.setattr(sk, "skinny_linear", spy)
    monkeypatch.setattr(talker_mod, "use_kernels", lambda x: True)
    pdl = [False]
    monkeypatch.setattr(layer_mod, "use_pdl", lambda x: pdl[0])
    one, two, many = torch.randn(1, 1, 32), torch.randn(2, 1, 32), torch.randn(65, 1, 32)
    with torch.no_grad():
        for one_row, heads, pdl[0] in ((False, False, True), (True, False, True), (False, True, False),
                                       (True, "auto", False), (True, "auto", True)):
            monkeypatch.setattr(talker_mod, "SKINNY_CODEC_HEAD", one_row)
            monkeypatch.setattr(layer_mod, "SKINNY_HEADS", heads)
            calls.clear()
            got = [t.codec_logits(x) for x in (one, two, many)]
            two_rows = heads is True or (heads == "auto" and pdl[0])
            assert calls == [(1, 32)] * one_row + [(2, 32)] * two_rows, (one_row, heads, pdl[0])
            for x, logits in zip((one, two, many), got):
                assert logits.shape == (x.shape[0], 1, 3072)
                assert torch.allclose(logits, t.codec_head(x), atol=ATOL)
        monkeypatch.setattr(talker_mod, "use_kernels", lambda x: False)         # a CPU tensor: never
        calls.clear()
        t.codec_logits(one), t.codec_logits(two)
        assert calls == []
