"""Speaker encoder of the Qwen3-TTS Base checkpoints: 24 kHz reference audio -> one x-vector.

The network is ECAPA-TDNN (Desplanques et al., 2020): a TDNN stem, SE-Res2Net blocks, multi-layer feature
aggregation, attentive statistics pooling and a final 1x1 projection to the talker's hidden size. Its
input is a log-mel spectrogram with a fixed recipe (`speaker_mel`). Module attribute names follow the
checkpoint (`speaker_encoder.blocks.1.res2net_block.blocks.0.conv.weight`, ...), so the state-dict keys are
the checkpoint keys without the `speaker_encoder.` prefix.

The official code embeds one reference clip at a time, without padding; so does this module. Batching clips
of different lengths would change the result, because every convolution pads its borders by reflection.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import SpeakerEncoderConfig

# The mel recipe is fixed by the checkpoint (sections 1.3 and 8 of the spec), not by the config.
MEL_SAMPLE_RATE = 24000
MEL_N_FFT = 1024
MEL_HOP = 256
MEL_WIN = 1024
MEL_BINS = 128
MEL_FMIN = 0.0
MEL_FMAX = 12000.0
_MEL_PAD = (MEL_N_FFT - MEL_HOP) // 2  # 384 reflected samples on each side
_LOG_FLOOR = 1e-5
_MAG_EPS = 1e-9


@functools.lru_cache(maxsize=None)
def _mel_filterbank_np() -> np.ndarray:
    import librosa

    # Slaney-style mel scale and area normalisation: librosa's defaults, as used in training.
    return librosa.filters.mel(sr=MEL_SAMPLE_RATE, n_fft=MEL_N_FFT, n_mels=MEL_BINS,
                               fmin=MEL_FMIN, fmax=MEL_FMAX).astype(np.float32)


def mel_filterbank(device: torch.device | str = "cpu") -> torch.Tensor:
    """The [128, 513] mel filterbank, float32."""
    return torch.from_numpy(_mel_filterbank_np()).to(device)


def speaker_mel(wav_24k) -> torch.Tensor:
    """Log-mel features of one 24 kHz clip: Tensor[samples] -> Tensor[1, frames, 128], float32.

    frames = (samples + 2*384 - 1024) // 256 + 1. Computed in float32 on the input's device (the official
    code computes it on the CPU). The clip must be longer than 384 samples (the reflection pad).
    """
    wav = torch.as_tensor(wav_24k)
    if wav.dim() != 1:
        raise ValueError(f"speaker_mel expects a 1-D waveform, got shape {tuple(wav.shape)}")
    wav = wav.to(torch.float32)
    if wav.numel() <= _MEL_PAD:
        raise ValueError(f"reference audio too short for the speaker encoder: {wav.numel()} samples "
                         f"(need more than {_MEL_PAD} at 24 kHz)")
    # Reflect-pad by (n_fft - hop)/2 and run an uncentred STFT: frames are centred without a zero border.
    padded = F.pad(wav.view(1, 1, -1), (_MEL_PAD, _MEL_PAD), mode="reflect").view(1, -1)
    window = torch.hann_window(MEL_WIN, device=wav.device)
    spec = torch.stft(padded, MEL_N_FFT, hop_length=MEL_HOP, win_length=MEL_WIN, window=window,
                      center=False, normalized=False, onesided=True, return_complex=True)
    # A tiny epsilon inside the square root keeps silent bins finite (and matches training).
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + _MAG_EPS)  # [1, 513, frames]
    mel = torch.matmul(mel_filterbank(wav.device), magnitude)  # [1, 128, frames]
    return torch.log(torch.clamp(mel, min=_LOG_FLOOR)).transpose(1, 2)


def _conv(in_ch: int, out_ch: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    """A "same" convolution whose borders are filled by reflection (how ECAPA-TDNN was trained).

    With kernel 1 there is nothing to pad, so a plain convolution computes exactly the same thing.
    """
    if kernel == 1:
        return nn.Conv1d(in_ch, out_ch, 1)
    return nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class _Tdnn(nn.Module):
    """Convolution + ReLU (a time-delay layer)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 1, dilation: int = 1):
        super().__init__()
        self.conv = _conv(in_ch, out_ch, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Split channels into `scale` groups; group i>0 is convolved after adding the previous group's output,
    so later groups see a growing receptive field. Group 0 passes through unchanged."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        if channels % scale:
            raise ValueError(f"Res2Net: {channels} channels do not split into {scale} groups")
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(_Tdnn(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        outs = [groups[0]]
        prev = None
        for i, block in enumerate(self.blocks, start=1):
            prev = block(groups[i] if prev is None else groups[i] + prev)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class _SqueezeExcite(nn.Module):
    """Rescale channels by a gate computed from their time average."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x.mean(dim=2, keepdim=True)
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(gate))))
        return x * gate


class _SeRes2NetBlock(nn.Module):
    """1x1 TDNN -> Res2Net -> 1x1 TDNN -> squeeze-excitation, with a residual connection."""

    def __init__(self, in_ch: int, out_ch: int, scale: int, se_ch: int, kernel: int, dilation: int):
        super().__init__()
        if in_ch != out_ch:
            raise ValueError("SE-Res2Net blocks need equal input and output channels (residual connection)")
        self.tdnn1 = _Tdnn(in_ch, out_ch)
        self.res2net_block = _Res2Net(out_ch, scale, kernel, dilation)
        self.tdnn2 = _Tdnn(out_ch, out_ch)
        self.se_block = _SqueezeExcite(out_ch, se_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation over time of x [B, C, T] under weights w (summing to 1 over T)."""
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=eps))


class _AttentiveStatsPool(nn.Module):
    """Attentive statistics pooling: a per-channel softmax over time, conditioned on the frame features and on
    the utterance's global mean and std, weights the final mean and std."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = _Tdnn(channels * 3, attention_channels)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        # Uniform weights 1/T (rather than x.mean) reproduce the training code's rounding exactly.
        uniform = torch.full((1, 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform, self.eps)
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        scores = self.conv(torch.tanh(self.tdnn(context)))
        weights = torch.softmax(scores, dim=2)
        mean, std = _weighted_stats(x, weights, self.eps)
        return torch.cat([mean, std], dim=1).unsqueeze(2)  # [B, 2C, 1]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN x-vector extractor. forward: log-mels [B, frames, mel_dim] -> x-vectors [B, enc_dim]."""

    def __init__(self, config: SpeakerEncoderConfig):
        super().__init__()
        ch, ks, dil = list(config.enc_channels), list(config.enc_kernel_sizes), list(config.enc_dilations)
        if not (len(ch) == len(ks) == len(dil)) or len(ch) < 3:
            raise ValueError("speaker encoder: enc_channels, enc_kernel_sizes and enc_dilations must have the "
                             "same length (at least 3)")
        self.config = config
        self.blocks = nn.ModuleList([_Tdnn(config.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(_SeRes2NetBlock(ch[i - 1], ch[i], config.enc_res2net_scale,
                                               config.enc_se_channels, ks[i], dil[i]))
        # Multi-layer feature aggregation over the outputs of all SE-Res2Net blocks.
        if sum(ch[1:-1]) != ch[-1]:
            raise ValueError(f"speaker encoder: the last channel count {ch[-1]} must equal the sum of the "
                             f"SE-Res2Net block channels {ch[1:-1]}")
        self.mfa = _Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], config.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, config.enc_dim)
        # Reflection padding needs more frames than the widest one-sided pad of any convolution.
        widest = max((d * (k - 1) + 1) // 2 for k, d in zip(ks, dil))
        self.min_frames = widest + 1

    @property
    def min_samples(self) -> int:
        """Shortest 24 kHz clip `extract_xvector` accepts."""
        return max(_MEL_PAD + 1, MEL_N_FFT - 2 * _MEL_PAD + (self.min_frames - 1) * MEL_HOP)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        if mels.dim() != 3 or mels.shape[-1] != self.config.mel_dim:
            raise ValueError(f"speaker encoder expects mels [B, frames, {self.config.mel_dim}], "
                             f"got {tuple(mels.shape)}")
        if mels.shape[1] < self.min_frames:
            raise ValueError(f"speaker encoder needs at least {self.min_frames} mel frames, got {mels.shape[1]}")
        h = mels.transpose(1, 2)
        block_outputs = []
        for block in self.blocks:
            h = block(h)
            block_outputs.append(h)
        h = self.mfa(torch.cat(block_outputs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.inference_mode()
    def extract_xvector(self, wav_24k) -> torch.Tensor:
        """One 24 kHz clip (Tensor or array [samples], values in [-1, 1]) -> x-vector Tensor[enc_dim].

        Mel features are computed in float32 on the clip's device, then cast to this module's device and
        dtype, as the official `extract_speaker_embedding` does.
        """
        wav = torch.as_tensor(wav_24k)
        if wav.dim() != 1:
            raise ValueError(f"extract_xvector expects a 1-D waveform, got shape {tuple(wav.shape)}")
        if wav.numel() < self.min_samples:
            raise ValueError(f"reference audio too short for the speaker encoder: {wav.numel()} samples, "
                             f"need at least {self.min_samples} at 24 kHz")
        param = next(self.parameters())
        mels = speaker_mel(wav).to(device=param.device, dtype=param.dtype)
        return self(mels)[0]


__all__ = ["SpeakerEncoder", "speaker_mel", "mel_filterbank", "MEL_SAMPLE_RATE"]
