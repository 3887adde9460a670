"""The codec decoder's upsampling stages over channels-last rows (voxflow/models/qwen3_tts/codec_upsample_cl.py) and
their depthwise convolution + LayerNorm kernel (voxflow/kernels/dwconv_layer_norm.py), on CPU tensors through
Triton's interpreter (in a subprocess, see tests/interpreter_child.py), against the plain [B, C, T] modules.

Tolerances: fp32 1e-5 (the test_codec_decoder.py bound for streaming against one pass; sums in another order). The
kernel in fp16 / bf16 against float64 math rounded at the same points: within one ulp of the output.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_UPSAMPLE_ROWS_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def dwconv_norm_reference(x, ctx, w, bias, nw, nb, eps):
    """float64 math with the kernel's rounding points: the convolution + bias rounded to x's dtype, then the
    LayerNorm rounded -> (out [B, T, C], the next context [B, C, K - 1])."""
    c, k = w.shape[0], w.shape[-1]
    padded = torch.cat([ctx, x.transpose(1, 2)], -1).double()
    h = F.conv1d(padded, w.double(), bias.double(), groups=c).to(x.dtype).double().transpose(1, 2)
    out = F.layer_norm(h, (c,), nw.double(), nb.double(), eps).to(x.dtype)
    return out, padded[..., padded.shape[-1] - (k - 1):].to(x.dtype)


def check_dwconv_layer_norm():
    """The kernel against dwconv_norm_reference: fp32 / fp16 / bf16, sequences longer and shorter than the context
    (whose next context then keeps part of the old one) and empty (the context kept), C not a power of two, a strided
    x; the next context bit for bit. Bad operands refused."""
    from voxflow.kernels.dwconv_layer_norm import dwconv_layer_norm
    g = torch.Generator().manual_seed(0)
    for dtype, ulp in ((torch.float32, 2 ** -20), (torch.float16, 2 ** -10), (torch.bfloat16, 2 ** -7)):
        for b, t, c, k in ((2, 9, 48, 7), (3, 3, 40, 7), (1, 0, 16, 7), (2, 20, 64, 3)):
            wide = torch.randn(b, t, 2 * c, generator=g).to(dtype)
            x = wide[..., :c]                                            # rows of stride 2C
            ctx = torch.randn(b, c, k - 1, generator=g).to(dtype)
            w = (torch.randn(c, 1, k, generator=g) * 0.3).to(dtype)
            bias, nw, nb = (torch.randn(c, generator=g).to(dtype) for _ in range(3))
            new = torch.full((b, c, k - 1), float("nan")).to(dtype)
            got = dwconv_layer_norm(x, ctx, w, bias, nw, nb, 1e-6, new)
            assert got.shape == (b, t, c) and got.is_contiguous()
            if t == 0:
                assert torch.equal(new, ctx)
                continue
            want, want_ctx = dwconv_norm_reference(x, ctx, w, bias, nw, nb, 1e-6)
            assert torch.equal(new, want_ctx), (dtype, t)
            err = (got.double() - want.double()).abs()
            assert (err <= want.double().abs() * ulp + 1e-6).all(), (dtype, (b, t, c, k), err.max().item())
            assert want.abs().max() > 1.0
    ok = dict(ctx=ctx, weight=w, bias=bias, norm_weight=nw, norm_bias=nb, eps=1e-6, new_ctx=new)
    with pytest.raises(ValueError, match="depthwise weight"):
        dwconv_layer_norm(x, **{**ok, "weight": w[:-1]})
    with pytest.raises(ValueError, match="new_ctx must be"):
        dwconv_layer_norm(x, **{**ok, "new_ctx": new.transpose(1, 2).contiguous().transpose(1, 2)})
    with pytest.raises(ValueError, match="share memory"):
        dwconv_layer_norm(x, **{**ok, "new_ctx": ctx})
    with pytest.raises(ValueError, match="norm_bias must be"):
        dwconv_layer_norm(x, **{**ok, "norm_bias": nb[:-1]})


def check_upsample_rows_stream_like_the_modules():
    """upsample_rows over a small decoder's two stages (random weights, the real x2 x2 rates): its rows equal the
    [B, C, T] modules' output streamed in pieces (1, 3 and 2 frames, two streams), the carried contexts equal, and
    in one pass without a state; through StateWriters (the codec pool's step) the same values, every ConvNeXt
    context written into its slot."""
    from test_codec_decoder import random_decoder               # tests/test_codec_decoder.py
    from voxflow.models.qwen3_tts.codec_decoder_blocks import ConvNeXtBlock, StateWriter
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state
    from voxflow.models.qwen3_tts.codec_upsample_cl import upsample_rows
    dec = random_decoder(seed=4).requires_grad_(False)
    c = dec.config.latent_dim
    x = torch.randn(2, c, 6, generator=torch.Generator().manual_seed(1))

    def modules(h, state):
        for stage in dec.upsample:
            for layer in stage:
                h = layer(h, state)
        return h

    keys = [m.dwconv.state_key for m in dec.modules() if isinstance(m, ConvNeXtBlock)]
    assert len(keys) == 2
    with torch.no_grad():
        want_state, state, carried = (init_stream_state(dec, 2).tensors for _ in range(3))
        for a, e in ((0, 1), (1, 4), (4, 6)):
            want = modules(x[..., a:e], want_state)
            got = upsample_rows(dec.upsample, x[..., a:e].transpose(1, 2).contiguous(), state)
            assert got.shape == (2, (e - a) * 4, c) and got.is_contiguous()
            torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-5, atol=1e-5)
            for key in keys:
                torch.testing.assert_close(state[key], want_state[key], rtol=1e-5, atol=1e-5)
            garbage = {k: torch.full_like(v, float("nan")) for k, v in carried.items() if v.is_floating_point()}
            writer = StateWriter(carried, garbage)
            written = upsample_rows(dec.upsample, x[..., a:e].transpose(1, 2).contiguous(), writer)
            assert torch.equal(written, got) and writer.written == set(keys)
            carried = {k: writer.slots[k] if k in writer.written else v for k, v in carried.items()}
        whole = upsample_rows(dec.upsample, x.transpose(1, 2).contiguous(), None)
        torch.testing.assert_close(whole.transpose(1, 2), modules(x, None), rtol=1e-5, atol=1e-5)


def check_decoder_takes_the_rows_path(monkeypatch):
    """CodecDecoder.forward with the switch on (its GPU gate forced on the CPU): the rows path runs (once a call)
    and the audio is the [B, C, T] path's, streamed and in one pass; off (the default), the modules run."""
    from test_codec_decoder import random_decoder
    from voxflow.models.qwen3_tts import codec_upsample_cl
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state
    dec = random_decoder(seed=5).requires_grad_(False)
    codes = torch.randint(0, 2048, (2, 16, 3), generator=torch.Generator().manual_seed(6))
    calls = []
    real = codec_upsample_cl.upsample_rows
    monkeypatch.setattr(codec_upsample_cl, "upsample_rows", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(codec_upsample_cl, "use_kernels", lambda t: True)
    outs = {}
    with torch.no_grad():
        for on in (False, True):
            monkeypatch.setattr(codec_upsample_cl, "ENABLED", on)
            state = init_stream_state(dec, 2).tensors
            outs[on] = (dec(codes), torch.cat([dec(codes[..., a:e], state) for a, e in ((0, 1), (1, 3))], -1))
            assert len(calls) == (3 if on else 0)
    for got, want in zip(outs[True], outs[False]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert outs[False][0].abs().max() > 0.05


def check_first_conv_takes_rows(monkeypatch):
    """codec_waveform_cl._first_conv with FIRST_CONV_CL (its TMA kernel taken, as on a Hopper GPU): h given as a
    [B, C, T] view of rows (what the rows path hands on) gives the same buffer and the same carried contexts as h
    contiguous, without the module's context concatenation; streamed (a carried context) and without a state."""
    from test_codec_decoder import random_decoder
    from voxflow.kernels import causal_conv
    from voxflow.models.qwen3_tts import codec_waveform_cl as cl
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state
    monkeypatch.setattr(cl, "FIRST_CONV_CL", True)
    monkeypatch.setattr(causal_conv, "CONV_TMA_FLAT", True)
    monkeypatch.setattr(causal_conv, "tma_by_default", lambda *a: True)
    dec = random_decoder(seed=7).requires_grad_(False)
    first, following = dec.decoder[0], cl._block_input(dec.decoder[1])
    g = torch.Generator().manual_seed(8)
    rows = torch.randn(2, 12, dec.config.latent_dim, generator=g)
    concatenated = []
    real = first.with_context
    monkeypatch.setattr(first, "with_context", lambda *a: concatenated.append(1) or real(*a))
    with torch.no_grad():
        states = [init_stream_state(dec, 2).tensors for _ in range(2)]
        ctx = torch.randn(states[0][first.state_key].shape, generator=g)
        for st in states:
            st[first.state_key] = ctx.clone()
        got = cl._first_conv(first, rows.transpose(1, 2), following, states[0])
        assert not concatenated
        want = cl._first_conv(first, rows.transpose(1, 2).contiguous(), following, states[1])
        assert concatenated
        assert torch.equal(got, want)
        for key in (first.state_key, following.key):
            assert torch.equal(states[0][key], states[1][key]), key
        assert not torch.equal(states[0][first.state_key], ctx)
        assert torch.equal(cl._first_conv(first, rows.transpose(1, 2), following, None),
                           cl._first_conv(first, rows.transpose(1, 2).contiguous(), following, None))


if IN_CHILD:
    def test_child_dwconv_layer_norm():
        check_dwconv_layer_norm()

    def test_child_upsample_rows():
        check_upsample_rows_stream_like_the_modules()

    def test_child_decoder_rows_path(monkeypatch):
        check_decoder_takes_the_rows_path(monkeypatch)

    def test_child_first_conv_takes_rows(monkeypatch):
        check_first_conv_takes_rows(monkeypatch)
else:
    def test_upsample_rows_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)

    def test_rows_path_needs_the_switch_and_a_gpu(monkeypatch):
        """supported(): on by default (VOXFLOW_CODEC_UPSAMPLE_CL=0 turns it off), but only for CUDA tensors with
        kernels on: a CPU tensor keeps the modules' path either way."""
        from test_codec_decoder import random_decoder
        from voxflow.models.qwen3_tts import codec_upsample_cl
        dec = random_decoder(seed=1)
        rows = torch.zeros(1, 4, dec.config.latent_dim)
        assert codec_upsample_cl.ENABLED is (os.environ.get("VOXFLOW_CODEC_UPSAMPLE_CL", "1") == "1")
        for on in (True, False):
            monkeypatch.setattr(codec_upsample_cl, "ENABLED", on)
            assert codec_upsample_cl.supported(dec.upsample, rows) is False        # a CPU tensor
