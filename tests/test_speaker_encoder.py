"""Voice-clone encoders: the ECAPA-TDNN speaker encoder with its mel front end, and the 12 Hz codec encoder."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from voxflow.models.qwen3_tts.codec_encoder import CodecEncoder
from voxflow.models.qwen3_tts.config import CodecConfig, SpeakerEncoderConfig, load_configs
from voxflow.models.qwen3_tts.speaker_encoder import SpeakerEncoder, mel_filterbank, speaker_mel
from voxflow.models.qwen3_tts.weights import load_into, read_safetensors, split_prefix

torch.set_num_threads(1)

TINY_SPK = SpeakerEncoderConfig(mel_dim=128, enc_dim=64, enc_channels=[32, 32, 32, 32, 96],
                                enc_attention_channels=16, enc_se_channels=16)


def clip(seconds: float, seed: int, sr: int = 24000) -> torch.Tensor:
    """A speech-like test signal: a few partials, a syllable-rate envelope and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    x = sum(a * np.sin(2 * np.pi * f * t + p)
            for a, f, p in zip(rng.uniform(0.05, 0.2, 6), rng.uniform(80, 6000, 6), rng.uniform(0, 6, 6)))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(len(t))
    return torch.from_numpy(np.clip(x, -0.95, 0.95).astype(np.float32))


def make_speaker_encoder(seed: int = 0) -> SpeakerEncoder:
    torch.manual_seed(seed)
    enc = SpeakerEncoder(TINY_SPK).eval()
    with torch.no_grad():  # default init is too tame to tell wiring mistakes apart; widen it
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return enc


# ---------------------------------------------------------------------------------------------- mel front end

def numpy_slaney_mel(sr=24000, n_fft=1024, n_mels=128, fmin=0.0, fmax=12000.0) -> np.ndarray:
    """Slaney mel filterbank (Auditory Toolbox): linear below 1 kHz, log above, area-normalised triangles."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(f):
        return f / f_sp if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / logstep

    def mel_to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    bins = np.linspace(0, sr / 2, n_fft // 2 + 1)
    rising = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def numpy_log_mel(x: np.ndarray) -> np.ndarray:
    x = np.pad(x.astype(np.float64), 384, mode="reflect")
    n_frames = 1 + (len(x) - 1024) // 256
    frames = np.stack([x[i * 256: i * 256 + 1024] for i in range(n_frames)])
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1024) / 1024)  # periodic Hann
    spec = np.fft.rfft(frames * window, axis=1)
    magnitude = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    mel = magnitude @ numpy_slaney_mel().T
    return np.log(np.maximum(mel, 1e-5))  # [frames, 128]


def test_mel_filterbank_is_slaney():
    fb = mel_filterbank()
    assert fb.shape == (128, 513) and fb.dtype == torch.float32
    assert np.allclose(fb.numpy(), numpy_slaney_mel(), atol=1e-7, rtol=1e-5)
    peaks = fb.argmax(dim=1)
    assert bool((peaks[1:] >= peaks[:-1]).all()) and bool((fb.sum(dim=1) > 0).all())  # ascending bands, none empty


def test_speaker_mel_matches_independent_numpy():
    x = clip(0.3, 1)
    mel = speaker_mel(x)
    frames = (len(x) + 2 * 384 - 1024) // 256 + 1
    assert mel.shape == (1, frames, 128) and mel.dtype == torch.float32
    ref = numpy_log_mel(x.numpy())
    assert np.abs(mel[0].numpy() - ref).max() < 1e-3
    # Silence hits the log floor of 1e-5 everywhere except where the 1e-9 magnitude epsilon lifts it.
    silent = speaker_mel(torch.zeros(4000))
    assert torch.allclose(silent, torch.full_like(silent, math.log(1e-5)), atol=0.5)
    assert torch.isfinite(silent).all()


def test_speaker_mel_rejects_bad_input():
    with pytest.raises(ValueError):
        speaker_mel(torch.zeros(384))
    with pytest.raises(ValueError):
        speaker_mel(torch.zeros(2, 4000))


# ---------------------------------------------------------------------------------------------- speaker encoder

def test_state_dict_matches_real_checkpoint_layout():
    with torch.device("meta"):
        enc = SpeakerEncoder(SpeakerEncoderConfig(enc_dim=2048))  # the 1.7B-Base speaker encoder
    sd = enc.state_dict()
    assert len(sd) == 76 and sum(v.numel() for v in sd.values()) == 12_001_088
    expected = {
        "blocks.0.conv.weight": (512, 128, 5),
        "blocks.1.tdnn1.conv.weight": (512, 512, 1),
        "blocks.3.res2net_block.blocks.6.conv.weight": (64, 64, 3),
        "blocks.2.se_block.conv1.weight": (128, 512, 1),
        "blocks.2.se_block.conv2.bias": (512,),
        "blocks.3.tdnn2.conv.bias": (512,),
        "mfa.conv.weight": (1536, 1536, 1),
        "asp.tdnn.conv.weight": (128, 4608, 1),
        "asp.conv.weight": (1536, 128, 1),
        "fc.weight": (2048, 3072, 1),
        "fc.bias": (2048,),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key


def reference_xvector(enc: SpeakerEncoder, mels: torch.Tensor) -> torch.Tensor:
    """ECAPA-TDNN written out with functional ops and explicit reflection padding, from the paper's recipe."""
    p = {k: v for k, v in enc.state_dict().items()}
    cfg = enc.config

    def conv(x, name, dilation=1, relu=True):
        w, b = p[name + ".weight"], p[name + ".bias"]
        total = dilation * (w.shape[-1] - 1)
        if total:
            x = F.pad(x, (total // 2, total - total // 2), mode="reflect")
        y = F.conv1d(x, w, b, dilation=dilation)
        return F.relu(y) if relu else y

    x = mels.transpose(1, 2)
    outs = []
    x = conv(x, "blocks.0.conv", cfg.enc_dilations[0])
    for i in range(1, len(cfg.enc_channels) - 1):
        pre = f"blocks.{i}."
        h = conv(x, pre + "tdnn1.conv")
        parts = list(h.chunk(cfg.enc_res2net_scale, dim=1))
        y = [parts[0]]
        for j in range(1, len(parts)):
            inp = parts[j] if j == 1 else parts[j] + y[-1]
            y.append(conv(inp, pre + f"res2net_block.blocks.{j - 1}.conv", cfg.enc_dilations[i]))
        h = conv(torch.cat(y, 1), pre + "tdnn2.conv")
        s = h.mean(2, keepdim=True)
        s = torch.sigmoid(conv(conv(s, pre + "se_block.conv1"), pre + "se_block.conv2", relu=False))
        x = h * s + x
        outs.append(x)
    h = conv(torch.cat(outs, 1), "mfa.conv")
    mu, sd = h.mean(2, keepdim=True), h.var(2, unbiased=False, keepdim=True).clamp(min=1e-12).sqrt()
    ctx = torch.cat([h, mu.expand_as(h), sd.expand_as(h)], 1)
    a = torch.softmax(conv(torch.tanh(conv(ctx, "asp.tdnn.conv")), "asp.conv", relu=False), dim=2)
    mu = (a * h).sum(2)
    sd = (a * (h - mu.unsqueeze(2)) ** 2).sum(2).clamp(min=1e-12).sqrt()
    return conv(torch.cat([mu, sd], 1).unsqueeze(2), "fc", relu=False).squeeze(2)


def test_speaker_encoder_matches_functional_reference():
    enc = make_speaker_encoder()
    mels = speaker_mel(clip(0.6, 2))
    with torch.no_grad():
        ours, ref = enc(mels), reference_xvector(enc, mels)
    assert ours.shape == (1, 64)
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5), (ours - ref).abs().max()


def test_xvector_shape_determinism_and_sensitivity():
    enc = make_speaker_encoder()
    a, b = clip(1.0, 3), clip(1.0, 4)
    xa = enc.extract_xvector(a)
    assert xa.shape == (64,) and xa.dtype == torch.float32 and torch.isfinite(xa).all()
    assert torch.equal(xa, enc.extract_xvector(a.clone()))
    assert torch.equal(xa, enc.extract_xvector(a.numpy()))
    assert (xa - enc.extract_xvector(b)).abs().max() > 1e-3
    assert torch.equal(make_speaker_encoder().extract_xvector(a), xa)  # same seed, same weights


def test_batched_forward_equals_one_by_one():
    enc = make_speaker_encoder()
    mels = torch.cat([speaker_mel(clip(0.5, 5)), speaker_mel(clip(0.5, 6))])
    with torch.no_grad():
        both = enc(mels)
        single = torch.cat([enc(mels[:1]), enc(mels[1:])])
    assert torch.allclose(both, single, atol=1e-5, rtol=1e-5)


def test_too_short_clip_is_rejected_clearly():
    enc = make_speaker_encoder()
    n = enc.min_samples
    assert enc.extract_xvector(clip(1.0, 7)[:n]).shape == (64,)
    with pytest.raises(ValueError, match="too short"):
        enc.extract_xvector(clip(1.0, 7)[: n - 1])


# ---------------------------------------------------------------------------------------------- codec encoder

TINY_MIMI = dict(
    model_type="mimi", audio_channels=1, codebook_dim=16, codebook_size=2048, compress=2, dilation_growth_rate=2,
    head_dim=8, hidden_act="gelu", hidden_size=32, intermediate_size=64, kernel_size=7, last_kernel_size=3,
    layer_scale_initial_scale=0.01, max_position_embeddings=8000, norm_eps=1e-5, num_attention_heads=4,
    num_filters=8, num_hidden_layers=2, num_key_value_heads=4, num_quantizers=32, num_residual_layers=1,
    num_semantic_quantizers=1, pad_mode="constant", residual_kernel_size=3, rope_theta=10000.0,
    sampling_rate=24000, sliding_window=250, trim_right_ratio=1.0, upsample_groups=32,
    upsampling_ratios=[8, 6, 5, 4], use_cache=False, use_causal_conv=True, use_conv_shortcut=False,
    use_streaming=False, vector_quantization_hidden_dimension=16, attention_bias=False, attention_dropout=0.0,
)


def tiny_codec_config(**overrides) -> CodecConfig:
    d = dict(decoder_config={}, encoder_config=dict(TINY_MIMI), encoder_valid_num_quantizers=16)
    d.update(overrides)
    return CodecConfig.from_dict(d)


def randomise_codebooks(enc: CodecEncoder, seed: int) -> dict[str, torch.Tensor]:
    """Codebooks start as zeros (every code 0); give them spread-out centroids, through strict loading."""
    g = torch.Generator().manual_seed(seed)
    tensors = dict(enc.state_dict())
    for k, v in tensors.items():
        if k.endswith("embed_sum"):
            tensors[k] = torch.randn(v.shape, generator=g) * 0.3
        elif k.endswith("cluster_usage"):
            tensors[k] = torch.rand(v.shape, generator=g) + 0.5
    load_into(enc, tensors, what="tiny codec encoder")
    return tensors


@pytest.fixture(scope="module")
def codec():
    torch.manual_seed(0)
    enc = CodecEncoder(tiny_codec_config()).eval()
    randomise_codebooks(enc, 0)
    return enc


def test_codec_state_dict_matches_real_checkpoint_layout():
    from transformers import MimiConfig

    real = CodecConfig.from_dict(dict(decoder_config={}, encoder_config=MimiConfig().to_dict()))
    with torch.device("meta"):
        enc = CodecEncoder(real)
    sd = enc.state_dict()
    # speech_tokenizer/model.safetensors holds 225 `encoder.*` tensors, 56,234,304 elements in all.
    assert len(sd) == 225 and sum(v.numel() for v in sd.values()) == 56_234_304
    assert {k.split(".")[0] for k in sd} == {"encoder", "encoder_transformer", "downsample", "quantizer"}
    assert tuple(sd["encoder.layers.0.conv.weight"].shape) == (64, 1, 7)
    assert tuple(sd["downsample.conv.weight"].shape) == (512, 512, 4)
    assert tuple(sd["encoder_transformer.layers.7.mlp.fc1.weight"].shape) == (2048, 512)
    assert tuple(sd["quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"].shape) == (2048, 256)
    assert not any(name.startswith(("decoder", "upsample")) for name, _ in enc.named_modules())


def test_codec_frame_count_and_code_range(codec):
    for n in (1, 1919, 1920, 1921, 24000, 48000, 30001):
        codes = codec.encode(clip(2.0, 8)[:n] if n <= 48000 else clip(n / 24000, 8))
        assert codes.shape == (math.ceil(n / 1920), 16), n
        assert codes.dtype == torch.long
        assert int(codes.min()) >= 0 and int(codes.max()) < 2048
    codes = codec.encode(clip(2.0, 9))
    assert codes.unique().numel() > 20  # real nearest-centroid choices, not a constant
    assert torch.equal(codes, codec.encode(clip(2.0, 9).numpy()))


def test_codec_batch_keeps_order_and_only_the_last_frame_may_differ(codec):
    a, b = clip(1.3, 10), clip(2.0, 11)
    batch = codec.encode_batch([a, b])
    assert [c.shape for c in batch] == [(17, 16), (25, 16)]
    alone_a, alone_b = codec.encode(a), codec.encode(b)
    assert torch.equal(batch[1], alone_b)  # the longest clip is not padded at all
    # Everything is causal: right padding cannot reach earlier frames. The last frame of a padded clip sees
    # real zeros instead of the downsampler's edge replication, as in the official batched encode.
    assert torch.equal(batch[0][:-1], alone_a[:-1])
    assert codec.encode_batch([]) == []


def test_codec_sees_reloaded_codebooks(codec):
    enc = CodecEncoder(tiny_codec_config()).eval()
    load_into(enc, dict(codec.state_dict()), what="copy")
    x = clip(1.0, 12)
    before = enc.encode(x)
    assert torch.equal(before, codec.encode(x))
    randomise_codebooks(enc, 1)  # new centroids after the first encode: no stale cache may survive
    fresh = CodecEncoder(tiny_codec_config()).eval()
    load_into(fresh, dict(enc.state_dict()), what="copy")
    after = enc.encode(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh.encode(x))


def test_codec_rejects_bad_input_and_config():
    enc = CodecEncoder(tiny_codec_config())
    with pytest.raises(ValueError):
        enc.encode(torch.zeros(0))
    with pytest.raises(ValueError):
        enc.encode(torch.zeros(2, 1000))
    with pytest.raises(ValueError, match="encode_downsample_rate"):
        CodecEncoder(tiny_codec_config(encode_downsample_rate=960))
    with pytest.raises(ValueError, match="encoder_valid_num_quantizers"):
        CodecEncoder(tiny_codec_config(encoder_valid_num_quantizers=33))


# ---------------------------------------------------------------------------------------------- real tiny checkpoint

def tiny_base_dir() -> str:
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if not root:
        pytest.skip("VOXFLOW_TINY_DIR is not set (no tiny checkpoints to load)")
    path = os.path.join(root, "base")
    if not os.path.exists(os.path.join(path, "config.json")):
        pytest.skip(f"no tiny Base checkpoint under {root}")
    return path


def test_strict_loading_of_tiny_base_checkpoint():
    folder = tiny_base_dir()
    cfg, codec_cfg, _ = load_configs(folder)
    assert cfg.speaker_encoder is not None

    spk_tensors = split_prefix(read_safetensors(os.path.join(folder, "model.safetensors")), "speaker_encoder.")
    spk = SpeakerEncoder(cfg.speaker_encoder).eval()
    assert set(spk.state_dict()) == set(spk_tensors)
    load_into(spk, spk_tensors, what="speaker encoder", prefix="speaker_encoder.")
    assert torch.equal(spk.fc.weight, spk_tensors["fc.weight"])
    xvec = spk.extract_xvector(clip(1.0, 13))
    assert xvec.shape == (cfg.speaker_encoder.enc_dim,) and torch.isfinite(xvec).all()

    codec_tensors = split_prefix(
        read_safetensors(os.path.join(folder, "speech_tokenizer", "model.safetensors")), "encoder.")
    enc = CodecEncoder(codec_cfg).eval()
    assert set(enc.state_dict()) == set(codec_tensors)
    load_into(enc, codec_tensors, what="codec encoder", prefix="encoder.")
    codes = enc.encode(clip(1.0, 14))
    assert codes.shape == (13, codec_cfg.encoder_valid_num_quantizers)
    assert int(codes.min()) >= 0 and int(codes.max()) < enc.mimi_config.codebook_size
