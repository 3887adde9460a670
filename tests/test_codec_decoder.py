"""The 12 Hz codec decoder (spec 7.2-7.4): single pass, stateful streaming, the official 300/25 windows, weights.

Most tests use a tiny decoder with the REAL rates (x2 x2 x8 x5 x4 x3 = 1920 samples per frame, sliding window 72)
and randomised weights. The default initialisation is nearly silent (zero SnakeBeta logs, ConvNeXt gammas 1e-6,
LayerScale 0.01, all-zero codebooks), under which wrong streaming state, wrong RoPE positions or a wrong window
would hardly change the audio; `random_decoder` widens every parameter and calibrates the last conv so the output
has std ~0.2 with almost nothing clamped, and `test_random_decoder_is_not_degenerate` guards that.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from torch import nn

from voxflow.models.qwen3_tts.codec_decoder import (CodecDecoder, FrameTransformer, LayerScale, RMSNorm,
                                                   official_decode)
from voxflow.models.qwen3_tts.codec_decoder_blocks import Codebook, ConvNeXtBlock, SnakeBeta
from voxflow.models.qwen3_tts.codec_streaming import CodecStream, CodecStreamState, init_stream_state, stream_decode
from voxflow.models.qwen3_tts.config import CodecDecoderConfig, load_configs
from voxflow.models.qwen3_tts.weights import WeightLoadError, load_into, read_safetensors, split_prefix

torch.set_num_threads(1)

CFG = CodecDecoderConfig(codebook_dim=16, hidden_size=32, latent_dim=32, decoder_dim=64, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=8, intermediate_size=64, num_hidden_layers=2,
                         vector_quantization_hidden_dimension=16)  # real rates, window 72, 16 codebooks of 2048
UP = 1920
WINDOW = 72
TOL = 1e-5
WEIGHTS_TXT = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_tts_weights.txt")


def random_decoder(seed: int = 0) -> CodecDecoder:
    """A CodecDecoder whose every part matters: see the module docstring."""
    torch.manual_seed(seed)
    dec = CodecDecoder(CFG).eval()
    g = torch.Generator().manual_seed(seed + 1)

    def randn(t, std):
        return torch.randn(t.shape, generator=g) * std

    def uniform(t, lo, hi):
        return lo + (hi - lo) * torch.rand(t.shape, generator=g)

    with torch.no_grad():
        for name, m in dec.named_modules():
            if isinstance(m, Codebook):
                m.embedding_sum.copy_(randn(m.embedding_sum, 1.0))
                m.cluster_usage.copy_(uniform(m.cluster_usage, 0.5, 2.0))
            elif isinstance(m, SnakeBeta):
                m.alpha.copy_(randn(m.alpha, 0.1))
                m.beta.copy_(randn(m.beta, 0.1))
            elif isinstance(m, ConvNeXtBlock):
                m.gamma.copy_(uniform(m.gamma, 0.1, 0.5))
            elif isinstance(m, LayerScale):
                m.scale.copy_(uniform(m.scale, 0.1, 0.5))
            elif isinstance(m, (RMSNorm, nn.LayerNorm)):
                m.weight.copy_(1.0 + randn(m.weight, 0.1))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(randn(m.bias, 0.1))
            elif isinstance(m, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)):
                w = m.weight
                if isinstance(m, nn.ConvTranspose1d):  # each output sample sums in_channels * kernel/stride terms
                    fan_in = w.shape[0] * w.shape[2] / m.stride[0]
                else:
                    fan_in = w[0].numel()
                # residual units: moderate gains keep the signal (and fp32 rounding) from growing stage by stage
                gain = 0.7 if name.endswith(".conv1.conv") else 0.3 if name.endswith(".conv2.conv") else 1.0
                w.copy_(randn(w, gain / math.sqrt(fan_in)))
                if m.bias is not None:
                    m.bias.copy_(randn(m.bias, 0.02))
        # calibrate the last conv so the pre-clamp output has std 0.2
        last = dec.decoder[-1].conv
        seen = []
        hook = dec.decoder[-1].register_forward_hook(lambda mod, i, o: seen.append(o))
        dec(torch.randint(0, CFG.codebook_size, (1, 16, 24), generator=g))
        hook.remove()
        scale = 0.2 / seen[0].std().item()
        last.weight.mul_(scale)
        last.bias.mul_(scale)
    return dec


def random_codes(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    """codes [B, 16, T]"""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.codebook_size, (batch, CFG.num_quantizers, frames), generator=g)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def dec() -> CodecDecoder:
    return random_decoder()


@pytest.fixture(scope="module")
def ref80(dec):
    """80 frames (> the 72-frame window) and their single-pass audio [80*1920]."""
    codes = random_codes(80, seed=10)[0]
    with torch.no_grad():
        return codes, dec(codes[None])[0, 0]


# ------------------------------------------------------------------------------------------------ sanity


def test_random_decoder_is_not_degenerate(dec, ref80):
    codes, wav = ref80
    assert wav.shape == (80 * UP,)
    assert torch.isfinite(wav).all()
    assert wav.std() > 0.1, "near-silent output: the comparisons below would mean little"
    assert (wav.abs() >= 1.0).float().mean() < 0.02, "too much of the output is clamped"
    frames = wav.view(80, UP)
    assert frames.std(dim=1).min() > 0.02, "some frame is near-constant"
    # the frame-rate transformer contributes: zeroing its residual branches changes the audio a lot
    d2 = random_decoder()
    with torch.no_grad():
        for layer in d2.pre_transformer.layers:
            layer.self_attn_layer_scale.scale.zero_()
        assert max_diff(d2(codes[None])[0, 0], wav) > 0.05
    # decode_frames is the [T, 16] convenience over the same pass
    assert torch.equal(dec.decode_frames(codes.T), wav)


# ------------------------------------------------------------------------------------------------ streaming


def stream_in_chunks(dec, codes: torch.Tensor, sizes) -> torch.Tensor:
    """codes [16, T] fed through stream_decode in chunks of `sizes` (may include 0) -> [T*1920]"""
    state = init_stream_state(dec)
    pieces, at = [], 0
    for n in sizes:
        wav, state = stream_decode(dec, codes[None, :, at: at + n], state)
        assert wav.shape == (1, 1, n * UP)
        pieces.append(wav[0, 0])
        at += n
    assert at == codes.shape[1]
    assert state.frames.tolist() == [at]
    return torch.cat(pieces)


@pytest.mark.parametrize("chunk", [1, 2, 7, 25])
def test_streaming_fixed_chunks_equal_single_pass(dec, ref80, chunk):
    codes, ref = ref80
    t = codes.shape[1]
    sizes = [chunk] * (t // chunk) + ([t % chunk] if t % chunk else [])
    got = stream_in_chunks(dec, codes, sizes)
    assert max_diff(got, ref) <= TOL


def test_streaming_mixed_schedule_equal_single_pass(dec, ref80):
    codes, ref = ref80
    g = torch.Generator().manual_seed(3)
    sizes, left = [0], codes.shape[1]  # an empty first call must be harmless too
    while left:
        n = min(left, int(torch.randint(1, 20, (1,), generator=g)))
        sizes.append(n)
        left -= n
        if len(sizes) == 4:
            sizes.append(0)
    assert len(set(sizes)) > 4
    assert max_diff(stream_in_chunks(dec, codes, sizes), ref) <= TOL
    # the one-request wrapper, fed [T, 16] frames
    stream = CodecStream(dec)
    got = torch.cat([stream.feed(codes[:, a:b].T) for a, b in ((0, 1), (1, 40), (40, 41), (41, 80))])
    assert max_diff(got, ref) <= TOL


def test_batched_streaming_join_reorder_leave(dec):
    """Requests at different stream positions share calls; each one's audio equals its own single pass."""
    codes = {name: random_codes(110, seed=20 + i)[0] for i, name in enumerate("ABC")}
    consumed = {name: 0 for name in "ABC"}
    audio = {name: [] for name in "ABC"}

    # C starts alone with its own chunk sizes, then joins the shared batch already 10 frames in
    c_state = init_stream_state(dec)
    for n in (4, 6):
        wav, c_state = stream_decode(dec, codes["C"][None, :, consumed["C"]: consumed["C"] + n], c_state)
        audio["C"].append(wav[0, 0])
        consumed["C"] += n

    chunks = [3, 5, 1, 8, 12, 2, 25, 7, 10, 4, 16, 6, 9]
    joins = {0: ("A", init_stream_state(dec)), 2: ("B", init_stream_state(dec)), 5: ("C", c_state)}
    leave_after = {"A": 10}
    g = torch.Generator().manual_seed(5)
    order: list[str] = []
    batch: CodecStreamState | None = None
    for step, n in enumerate(chunks):
        if step in joins:
            name, s = joins[step]
            batch = s if batch is None else CodecStreamState.cat([batch, s])
            order.append(name)
        perm = torch.randperm(len(order), generator=g)
        batch, order = batch.select(perm), [order[i] for i in perm]  # reorder rows
        assert batch.batch_size == len(order)
        assert batch.frames.tolist() == [consumed[r] for r in order]

        x = torch.stack([codes[r][:, consumed[r]: consumed[r] + n] for r in order])
        wav, batch = stream_decode(dec, x, batch)
        for i, r in enumerate(order):
            audio[r].append(wav[i, 0])
            consumed[r] += n

        gone = [r for r in order if leave_after.get(r) == step]
        if gone:
            keep = torch.tensor([r not in gone for r in order])
            batch, order = batch.select(keep), [r for r in order if r not in gone]
    assert batch.batch_size == 2  # B and C to the end

    assert consumed == {"A": 93, "B": 100, "C": 89}  # all beyond the attention window
    for r in "ABC":
        with torch.no_grad():
            ref = dec(codes[r][None, :, : consumed[r]])[0, 0]
        assert max_diff(torch.cat(audio[r]), ref) <= TOL, r


def test_state_is_bounded_pure_and_replayable(dec):
    codes = random_codes(180, seed=30)
    state = init_stream_state(dec)
    sizes, shapes = {}, {}
    for at in range(0, 160, 16):
        _, state = stream_decode(dec, codes[..., at: at + 16], state)
        if state.frames.item() in (80, 160):
            sizes[state.frames.item()] = state.nbytes
            shapes[state.frames.item()] = {k: tuple(v.shape) for k, v in state.tensors.items()}
    assert sizes[80] == sizes[160] == init_stream_state(dec).nbytes
    assert shapes[80] == shapes[160]

    # stream_decode never mutates the state it is given: replaying from it gives identical audio
    before = {k: v.clone() for k, v in state.tensors.items()}
    wav1, s1 = stream_decode(dec, codes[..., 160:172], state)
    wav2, s2 = stream_decode(dec, codes[..., 160:172], state)
    assert all(torch.equal(before[k], v) for k, v in state.tensors.items())
    assert torch.equal(wav1, wav2)
    assert all(torch.equal(s1.tensors[k], s2.tensors[k]) for k in s1.tensors)
    assert s1.frames.item() == 172 and state.frames.item() == 160
    # a state moved around (here cpu -> cpu) continues the same way
    wav3, _ = stream_decode(dec, codes[..., 160:172], state.to("cpu"))
    assert torch.equal(wav1, wav3)
    # and different next frames give different audio (the replay check is not vacuous)
    wav4, _ = stream_decode(dec, codes[..., 168:180], state)
    assert max_diff(wav4, wav1) > 1e-2


def test_single_pass_is_causal(dec):
    t, changed = 100, 60
    codes = random_codes(t, seed=40)
    other = codes.clone()
    other[..., changed] = (other[..., changed] + 1 + torch.arange(16)) % CFG.codebook_size
    with torch.no_grad():
        a, b = dec(codes)[0, 0], dec(other)[0, 0]
    cut = changed * UP
    assert torch.equal(a[:cut], b[:cut])
    assert max_diff(a[cut: cut + UP], b[cut: cut + UP]) > 1e-2
    # far beyond the convolutions' reach (~9 frames), attention still carries the change
    assert max_diff(a[(changed + 30) * UP:], b[(changed + 30) * UP:]) > 1e-4


def test_attention_window_is_72_frames():
    """One layer: frame q attends to frames q-71..q (spec 7.2), so a change at frame 10 reaches frames 10..81."""
    torch.manual_seed(2)
    tr = FrameTransformer(dataclasses.replace(CFG, num_hidden_layers=1)).eval()
    with torch.no_grad():
        tr.layers[0].self_attn_layer_scale.scale.fill_(0.5)
        x = torch.randn(1, 100, CFG.latent_dim)
        x2 = x.clone()
        x2[:, 10] += 2.0
        diff = (tr(x) - tr(x2)).abs().amax(dim=-1)[0]
    assert diff[:10].max() == 0
    assert diff[10: 10 + WINDOW].min() > 1e-4
    assert diff[10 + WINDOW:].max() <= 1e-6


# ------------------------------------------------------------------------------------- the official decode


def test_official_decode_short_batch_is_one_pass(dec):
    long_, short = 120, 70
    codes = random_codes(long_, seed=50, batch=2).transpose(1, 2).clone()  # [B, T, 16]
    codes[1, short:] = -1
    wavs = official_decode(dec, codes)
    assert [w.shape[0] for w in wavs] == [long_ * UP, short * UP]
    with torch.no_grad():
        ref0 = dec(codes[0].T[None])[0, 0]
        ref1 = dec(codes[1, :short].T[None])[0, 0]
    assert max_diff(wavs[0], ref0) <= TOL
    assert max_diff(wavs[1], ref1) <= TOL


def test_official_decode_long_restarts_after_300_frames(dec):
    t = 340
    codes = random_codes(t, seed=60)
    (wav,) = official_decode(dec, codes.transpose(1, 2))
    assert wav.shape == (t * UP,)
    with torch.no_grad():
        ref = dec(codes)[0, 0]
    # causal single pass: its first 300 frames are the single pass of the first 300 frames
    assert max_diff(wav[: 300 * UP], ref[: 300 * UP]) <= TOL
    # the 2nd window starts from scratch with 25 frames of context: not a single pass any more
    assert max_diff(wav[300 * UP:], ref[300 * UP:]) > 1e-2
    # ... but exactly the single pass of frames 275..339 with the context audio dropped
    with torch.no_grad():
        window = dec(codes[..., 275:])[0, 0]
    assert max_diff(wav[300 * UP:], window[25 * UP:]) <= TOL


# -------------------------------------------------------------------------------------------------- weights


def released_decoder_keys() -> set[str]:
    """Key names of the released codec decoder (tests/fixtures), limited to the tiny config's 2 layers."""
    keys, inside = set(), False
    with open(WEIGHTS_TXT) as f:
        for line in f:
            if line.startswith("# =="):
                inside = "speech_tokenizer" in line
            elif inside and line.startswith("decoder."):
                key = line.split()[0][len("decoder."):]
                if key.startswith("pre_transformer.layers.") and int(key.split(".")[2]) >= CFG.num_hidden_layers:
                    continue
                keys.add(key)
    return keys


def test_weight_names_match_the_release():
    keys = set(CodecDecoder(CFG).state_dict())
    for k in ("quantizer.rvq_first.input_proj.weight", "quantizer.rvq_first.output_proj.weight",
              "quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
              "quantizer.rvq_rest.vq.layers.14._codebook.cluster_usage", "pre_conv.conv.weight",
              "pre_transformer.input_proj.weight", "pre_transformer.layers.1.self_attn.q_proj.weight",
              "pre_transformer.layers.0.self_attn_layer_scale.scale", "pre_transformer.norm.weight",
              "upsample.0.0.conv.weight", "upsample.1.1.dwconv.conv.weight", "upsample.1.1.gamma",
              "decoder.0.conv.weight", "decoder.1.block.0.alpha", "decoder.1.block.1.conv.weight",
              "decoder.4.block.4.conv1.conv.weight", "decoder.5.beta", "decoder.6.conv.bias"):
        assert k in keys, k
    assert "quantizer.rvq_rest.vq.layers.15._codebook.embedding_sum" not in keys
    assert not any("inv_freq" in k for k in keys)
    if os.path.exists(WEIGHTS_TXT):
        assert keys == released_decoder_keys()


def test_load_tiny_checkpoint():
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if not root:
        pytest.skip("VOXFLOW_TINY_DIR is unset (tests/conftest.py sets it when it generates the tiny checkpoints)")
    folder = os.path.join(root, "custom_voice")
    _, codec, _ = load_configs(folder)
    cfg = codec.decoder
    assert cfg.total_upsample == UP and cfg.sliding_window == WINDOW
    tensors = read_safetensors(os.path.join(folder, "speech_tokenizer", "model.safetensors"), prefix="decoder.")
    weights = split_prefix(tensors, "decoder.")
    assert weights and len(weights) == len(tensors)

    dec = CodecDecoder(cfg).eval()
    load_into(dec, weights, what="tiny codec decoder", prefix="decoder.")
    for k, v in dec.state_dict().items():
        assert torch.equal(v, weights[k]), k

    # a missing key fails loudly, naming it with its checkpoint prefix
    broken = dict(weights)
    del broken["quantizer.rvq_first.input_proj.weight"]
    with pytest.raises(WeightLoadError, match="decoder.quantizer.rvq_first.input_proj.weight"):
        load_into(CodecDecoder(cfg), broken, what="tiny codec decoder", prefix="decoder.")

    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        wav = dec(codes)[0, 0]
    assert wav.shape == (12 * UP,) and torch.isfinite(wav).all() and wav.std() > 0
    streamed = stream_in_chunks(dec, codes[0], [5, 1, 6])
    assert max_diff(streamed, wav) <= TOL


def test_codebook_table_is_made_once_per_weight_version():
    from voxflow.models.qwen3_tts.codec_decoder_blocks import Codebook
    cb = Codebook(8, 4)
    with torch.no_grad():
        cb.embedding_sum.normal_()
        cb.cluster_usage.uniform_(0.5, 2.0)
    first = cb.embeddings()
    assert cb.embeddings() is first                                   # kept
    assert torch.equal(first, cb.embedding_sum / cb.cluster_usage.clamp(min=1e-5)[:, None])
    with torch.no_grad():
        cb.cluster_usage.mul_(2.0)                                    # new weight version: made again
    again = cb.embeddings()
    assert again is not first and torch.allclose(again, first / 2.0)


def test_derived_weights_of_one_owner_are_told_apart_by_tag():
    """Two derivations of the same parameters on one owner (codec_waveform_cl: the transposed convolution's GEMM
    operand and its sub-pixel form) never serve each other's tensor."""
    from voxflow.layers.derived_weights import per_weight_version
    from voxflow.models.qwen3_tts.codec_decoder_blocks import CausalConvTranspose1d
    up = CausalConvTranspose1d(4, 3, 6, 3)
    w = up.conv.weight
    gemm = per_weight_version(up, (w,), lambda: w.reshape(4, -1).clone())
    sub = per_weight_version(up, (w,), lambda: (w.flip(-1).clone(), None), tag="subpixel")
    assert isinstance(sub, tuple) and sub[0].shape == w.shape
    assert per_weight_version(up, (w,), lambda: (w.flip(-1).clone(), None), tag="subpixel") is sub      # kept
    assert per_weight_version(up, (w,), lambda: w.reshape(4, -1).clone()) is not gemm                   # made again
    assert torch.equal(per_weight_version(up, (w,), lambda: None), gemm)


@pytest.mark.parametrize("cudnn_tf32", [True, False])
def test_codec_matmuls_follow_cudnns_tf32_switch(dec, cudnn_tf32):
    """The codec is one precision class (CodecDecoder.forward): its linears see PyTorch's matmul TF32 switch set to
    cuDNN's for the call (on a GPU: TF32 like its convolutions, instead of plain fp32 FMA GEMMs), and the switch is
    back to the caller's value afterwards (the talker's fp32 GEMMs never run in TF32)."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(torch.backends.cuda.matmul.allow_tf32))
             for m in (dec.pre_transformer.input_proj, dec.upsample[0][1].pwconv1)]
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.backends.cuda.matmul.allow_tf32 = not cudnn_tf32
        with torch.no_grad():
            dec(random_codes(3, seed=5))
        assert seen == [cudnn_tf32, cudnn_tf32]
        assert torch.backends.cuda.matmul.allow_tf32 is (not cudnn_tf32)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        for h in hooks:
            h.remove()


def test_derived_weights_inside_a_capture_are_never_kept_and_with_none_in_capture_not_made(monkeypatch):
    """per_weight_version during a CUDA-graph capture (stood in for: a CUDA-flagged parameter, capture reported):
    a kept tensor is served; a missing one is made but not kept, or with none_in_capture not made at all (None;
    code_predictor.projected_tables takes its projection path then)."""
    import types
    from voxflow.layers import derived_weights as dw
    owner = types.SimpleNamespace(_derived=None)
    w = torch.ones(2)
    param = types.SimpleNamespace(is_cuda=True, data_ptr=w.data_ptr, _version=0, dtype=w.dtype, device=w.device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    made = []
    assert dw.per_weight_version(owner, (param,), lambda: made.append(1) or "t", none_in_capture=True) is None
    assert made == [] and owner._derived is None
    assert dw.per_weight_version(owner, (param,), lambda: made.append(1) or "t") == "t"
    assert made == [1] and owner._derived is None                          # made, not kept
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert dw.per_weight_version(owner, (param,), lambda: "kept", none_in_capture=True) == "kept"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert dw.per_weight_version(owner, (param,), lambda: "new", none_in_capture=True) == "kept"   # served


def test_attention_projects_q_k_v_with_one_gemm_on_the_gpu_path(dec, ref80, monkeypatch):
    """On the GPU path (stood in for: the kernel switch forced on for the codec decoder module) each codec attention
    layer runs one GEMM over its fused q|k|v weight, whose rows the three Linears' weights are views of (so loading
    a checkpoint fills it); the audio stays the three GEMMs' within fp32 summation order."""
    from torch.nn import functional as F
    from voxflow.models.qwen3_tts import codec_decoder
    attn = dec.pre_transformer.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn._qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == attn._qkv[-attn.v_proj.out_features:].data_ptr()
    layers = [layer.self_attn for layer in dec.pre_transformer.layers]
    fused = {id(a._qkv) for a in layers}
    alone = {id(lin.weight) for a in layers for lin in (a.q_proj, a.k_proj, a.v_proj)}
    weights = []
    linear = F.linear            # (torch.nn.functional's own: nn.Linear's forward goes through it too)
    monkeypatch.setattr(codec_decoder.F, "linear", lambda x, w, *a: weights.append(id(w)) or linear(x, w, *a))
    monkeypatch.setattr(codec_decoder, "use_kernels", lambda t: True)
    codes, want = ref80
    with torch.no_grad():
        got = dec(codes[None, :, :30])[0, 0]
    assert sum(w in fused for w in weights) == len(layers) and not alone & set(weights)
    assert max_diff(got, want[: got.shape[0]]) < 1e-5
