"""The 12 Hz codec decoder ("Code2Wav"): 16 codebooks per 80 ms frame -> 1920 samples of 24 kHz audio.

Pipeline (spec 7.2): RVQ dequantisation -> causal conv -> sliding-window transformer at frame rate ->
2 x (transposed conv x2 + ConvNeXt) -> causal conv -> 4 SnakeBeta upsampling blocks (x8, x5, x4, x3) ->
SnakeBeta -> causal conv to one channel -> clamp to [-1, 1].

Three ways to decode:
- `CodecDecoder.forward(codes)`: one pass over whole sequences (what a stateful stream reproduces);
- `official_decode(decoder, codes)`: the official `decode` (300-frame windows, 25 frames of context), for parity;
- `codec_streaming.stream_decode`: incremental, with per-request state (same modules, `state` argument).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.conv_transpose_gemm import conv_gemm_precision
from voxflow.layers.fused_linear import fuse_weights, kept_fused
from voxflow.layers.mlp import SwiGLU
from voxflow.layers.rms_norm import RMSNorm, add_rms_norm
from voxflow.layers.rotary import apply_rotary

from . import codec_upsample_cl, codec_waveform_cl
from .codec_decoder_blocks import (FRAME_KERNELS, CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, DecoderBlock,
                                   SnakeBeta, SplitDequantizer, StreamingModule, StreamTensors, keep, new_value)
from .config import CodecDecoderConfig

# ------------------------------------------------------------------------------------ frame-rate transformer

# The streamed attention as one Triton kernel a layer on a GPU (voxflow/kernels/window_attention.py) instead of the
# window's concatenation, a boolean mask, cuDNN's attention (11.5 us a layer in a 16-stream 1-frame call on an H100,
# session 39) and a transpose copy; fp32 softmax, half-precision results within rounding of PyTorch's. On by
# default; session 40 (H100): a 16-stream call's kernel time 1.49 -> 1.38 ms at 1 frame, 10.96 -> 10.84 at 25
# (benchmarks/results/h100/2026-12-05-session40). VOXFLOW_CODEC_WINDOW_ATTENTION=0: PyTorch's (a switch of its own,
# apart from codec_decoder_blocks.FRAME_KERNELS).
WINDOW_ATTENTION = os.environ.get("VOXFLOW_CODEC_WINDOW_ATTENTION", "1") == "1"


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class SlidingWindowAttention(StreamingModule):
    """Causal self-attention over the last `window` frames (itself included), RoPE on q and k, no biases.

    Streaming state: the rotated keys and the values of the `window - 1` frames before the next call's first
    frame. Keys are stored after RoPE at their absolute positions, so cached keys never need re-rotating.
    """

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.cache_len = cfg.sliding_window - 1
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        # q|k|v as one weight for the GPU path's one GEMM (fused_linear.py; made before the load, as the talker's)
        self._qkv = fuse_weights([self.q_proj, self.k_proj, self.v_proj])

    def fused_groups(self) -> dict[str, list[nn.Linear]]:
        """Fused weight attribute -> the Linears whose weights are views of it (fused_linear.cast_fused_groups)."""
        return {"_qkv": [self.q_proj, self.k_proj, self.v_proj]}

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, T, H * D]: on the GPU path one GEMM over the fused weight, sliced (views); else three."""
        if use_kernels(x):
            self._qkv = kept_fused(self._qkv, [self.q_proj, self.k_proj, self.v_proj])  # None in a capture: 3 GEMMs
            if self._qkv is not None:
                nq, nk = self.q_proj.out_features, self.k_proj.out_features
                qkv = F.linear(x, self._qkv)
                return qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def init_state(self, batch, device, dtype):
        shape = (batch, self.n_kv_heads, self.cache_len, self.head_dim)
        return {f"{self.state_key}.k": torch.zeros(shape, device=device, dtype=dtype),
                f"{self.state_key}.v": torch.zeros(shape, device=device, dtype=dtype)}

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: "WindowMask",
                state: StreamTensors | None = None) -> torch.Tensor:
        """x [B, T, C]; cos/sin [B or 1, T, head_dim]; mask: which of the S keys (cached + T when streaming, else T)
        each query may attend (`WindowMask`)."""
        b, t, _ = x.shape
        q, k, v = (p.view(b, t, -1, self.head_dim).transpose(1, 2) for p in self._project(x))
        # q * cos + rotate_half(q) * sin (and k): on a GPU one Triton launch with the same bits instead of ~10
        # element-wise kernels a layer (voxflow/kernels/rotary.py)
        q, k = apply_rotary(q, k, cos, sin)
        keys = f"{self.state_key}.k", f"{self.state_key}.v"
        if state is not None and mask.start is not None and WINDOW_ATTENTION and use_kernels(q):
            from voxflow.kernels import window_attention as fused
            k_cache, v_cache = state[keys[0]], state[keys[1]]
            if fused.supported(q, k_cache, v_cache, k, v):
                # one launch reading the carried window and the new rows where they lie, the mask from the
                # positions, the output as o_proj's rows (window_attention.py); the window carried on separately
                out = fused.window_attention(q, k_cache, v_cache, k, v, mask.start, self.head_dim ** -0.5)
                _window(state, *keys, k, v, whole=False)
                return self.o_proj(out)
        if state is not None:
            k, v = _window(state, *keys, k, v)
        mask = mask.dense()
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _window(state: StreamTensors, k_key: str, v_key: str, k: torch.Tensor, v: torch.Tensor, whole: bool = True
            ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The cached window's keys / values [B, H, L, D] (state[k_key], state[v_key]) followed by the call's [B, H, T,
    D] -> (all keys, all values; None, None unless `whole`); the last L of each become the state's next window. On a
    GPU one Triton launch (voxflow/kernels/kv_window.py), which writes the next window straight into a StateWriter's
    slots, instead of two concatenations and two copies; the same values."""
    k_cache, v_cache = state[k_key], state[v_key]
    if FRAME_KERNELS and use_kernels(k):
        from voxflow.kernels import kv_window as fused
        if fused.supported(k_cache, v_cache, k, v):
            keep_out = new_value(state, k_key, k_cache), new_value(state, v_key, v_cache)
            k_all, v_all, _, _ = fused.kv_window(k_cache, v_cache, k, v, keep_out=keep_out, write_all=whole)
            return k_all, v_all
    cached, t = k_cache.shape[2], k.shape[2]
    if not whole:                     # only the carried rows: the last L of the cache's rows after T, then the new
        for key, old, new in ((k_key, k_cache, k), (v_key, v_cache, v)):
            tail = torch.cat([old[:, :, min(t, cached):], new], dim=2)
            keep(state, key, tail[:, :, tail.shape[2] - cached:], owned=tail.shape[2] == cached)
        return None, None
    k, v = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
    keep(state, k_key, k[:, :, t:])
    keep(state, v_key, v[:, :, t:])
    return k, v


class WindowMask:
    """Which keys each of a call's T queries may attend: frame q the `window` frames q - window + 1 .. q, none at a
    negative position (a young stream's unused cache slots). Streaming (`start`: LongTensor [B], the frames each
    stream had before the call) the keys are the `cached` carried frames and then the call's; without a state, the
    call's T frames of fresh sequences. The positions and the boolean [B or 1, 1, T, S] mask PyTorch's attention
    takes are built on first use (once for all layers): the window attention kernel takes `start` instead, so with
    it none is built."""

    def __init__(self, window: int, t: int, start: torch.Tensor | None, cached: int, device):
        self.window, self.t, self.start, self.cached, self.device = window, t, start, cached, device
        self._positions: tuple[torch.Tensor, torch.Tensor] | None = None
        self._dense: torch.Tensor | None = None

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(query positions [B or 1, T], key positions [B or 1, S])."""
        if self._positions is None:
            steps = torch.arange(self.t, device=self.device)
            if self.start is None:   # the same for every row: mask and RoPE broadcast over the batch
                self._positions = steps[None], steps[None]
            else:
                self._positions = (self.start[:, None] + steps,
                                   self.start[:, None] + torch.arange(-self.cached, self.t, device=self.device))
        return self._positions

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            q_pos, k_pos = self.positions()
            delta = q_pos[:, :, None] - k_pos[:, None, :]
            self._dense = ((delta >= 0) & (delta < self.window) & (k_pos >= 0)[:, None, :])[:, None]
        return self._dense


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = SlidingWindowAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, normed: torch.Tensor, cos, sin, mask, state, next_norm: RMSNorm
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x + attn(input_layernorm(x)) then + mlp(post_attention_layernorm(.)), each branch LayerScale'd, given
        normed = input_layernorm(x) -> (the new x, next_norm(the new x)): each residual add and the norm after it
        are one pass on a GPU (`_add_norm`), so the caller hands the normed stream from layer to layer."""
        x, normed = _add_norm(self.self_attn(normed, cos, sin, mask, state), self.self_attn_layer_scale, x,
                              self.post_attention_layernorm)
        x, normed = _add_norm(self.mlp(normed), self.mlp_layer_scale, x, next_norm)
        return x, normed


def _add_norm(branch: torch.Tensor, layer_scale: LayerScale, x: torch.Tensor, norm: RMSNorm
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + layer_scale(branch), norm of that): on a GPU one Triton pass with the separate operations' rounding
    (voxflow/kernels/rms_norm.py, the add's operands in the other order: the same sums); VOXFLOW_CODEC_FRAME_KERNELS=0
    leaves the multiply, the add and the norm apart."""
    if FRAME_KERNELS:
        normed, x = add_rms_norm(branch, x, norm.weight, norm.eps, scale=layer_scale.scale)
        return x, normed
    x = x + layer_scale(branch)
    return x, norm(x)


class FrameTransformer(StreamingModule):
    """latent_dim -> hidden_size -> N sliding-window layers -> RMSNorm -> latent_dim, on [B, T, latent_dim].

    Streaming state: the number of frames each request has consumed (its next absolute RoPE position).
    """

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.window = cfg.sliding_window
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def init_state(self, batch, device, dtype):
        return {f"{self.state_key}.pos": torch.zeros(batch, dtype=torch.long, device=device)}

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, T, head_dim] for absolute positions [B, T] (B may be 1), computed in fp32 then cast."""
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        t = x.shape[1]
        pos_key = f"{self.state_key}.pos"
        start = None if state is None else state[pos_key]
        mask = WindowMask(self.window, t, start, self.layers[0].self_attn.cache_len, x.device)
        if start is not None and FRAME_KERNELS and use_kernels(x):
            # the tables and the next positions in one launch (voxflow/kernels/rope_table.py) instead of ~12
            from voxflow.kernels import rope_table as fused
            if fused.supported(start, self.inv_freq, x.dtype):
                cos, sin = fused.rope_table(start, t, self.inv_freq, x.dtype, new_value(state, pos_key, start))
                return self._layers(x, cos, sin, mask, state)
        if start is not None:
            torch.add(start, t, out=new_value(state, pos_key, start))   # (a StateWriter's slot: no copy after)
        cos, sin = self.rope(mask.positions()[0], x.dtype)
        return self._layers(x, cos, sin, mask, state)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: "WindowMask",
                state: StreamTensors | None) -> torch.Tensor:
        h = self.input_proj(x)
        normed = self.layers[0].input_layernorm(h)
        for i, layer in enumerate(self.layers):
            following = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            h, normed = layer(h, normed, cos, sin, mask, state, following)
        return self.output_proj(normed)


# --------------------------------------------------------------------------------------------- the decoder


class CodecDecoder(nn.Module):
    """Codes [B, num_quantizers, T] -> waveform [B, 1, T * total_upsample]. Weight names = checkpoint's `decoder.*`."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.config = cfg
        self.total_upsample = cfg.total_upsample
        self.quantizer = SplitDequantizer(cfg.num_quantizers, cfg.num_semantic_quantizers, cfg.codebook_size,
                                          cfg.codebook_dim // 2, cfg.codebook_dim)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, kernel_size=3)
        self.pre_transformer = FrameTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv1d(cfg.latent_dim, dims[0], kernel_size=7),
            *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)),
            SnakeBeta(dims[-1]),
            CausalConv1d(dims[-1], 1, kernel_size=7),
        ])
        # Each stateful block stores its context under its own weight-name prefix.
        for name, module in self.named_modules():
            if isinstance(module, StreamingModule):
                module.state_key = name

    def forward(self, codes: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        """codes [B, Q, T] (values in [0, codebook_size)). With `state` (see codec_streaming), decodes T new
        frames of ongoing streams and updates `state` in place; without, decodes whole sequences.

        Precision: every matrix multiply of the decoder (the frame transformer's and ConvNeXt blocks' linears as
        well as the convolutions run as GEMMs) takes TF32 for fp32 inputs exactly when cuDNN's convolutions may
        (`torch.backends.cudnn.allow_tf32`, PyTorch's default: on), so the codec is one precision class: "fp32 with
        TF32", 46.28 dB SNR against plain fp32 (benchmarks/results/h200/2026-12-01-session9, call 4:
        `voxflow.tools.codec_snr --tf32`). PyTorch's matmul switch alone would leave the linears in plain fp32 FMA
        kernels: 1.8 of a c=256 step's 13.4 codec milliseconds on an H200 (11.75 with them in TF32; calls 3 and 5)."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"expected codes [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")
        with conv_gemm_precision():
            return self._decode(codes, state)

    def _decode(self, codes: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
        h = self.pre_conv(self.quantizer(codes), state)
        if codec_upsample_cl.supported(self.upsample, h):
            # rows throughout (codec_upsample_cl.py); the transformer's input made contiguous first: as a [C, T]
            # view its input projection ran on cuBLAS's unaligned kernel (25 us for 0.8 GFLOP, session 54)
            rows = self.pre_transformer(h.transpose(1, 2).contiguous(), state)
            h = codec_upsample_cl.upsample_rows(self.upsample, rows, state).transpose(1, 2)
        else:
            h = self.pre_transformer(h.transpose(1, 2), state).transpose(1, 2)
            for stage in self.upsample:
                for layer in stage:
                    h = layer(h, state)
        if codec_waveform_cl.supported(h):
            h = codec_waveform_cl.waveform_stack(self.decoder, h, state)     # GPU: channels-last, fused kernels
        else:
            for layer in self.decoder:
                h = layer(h, state)
        return h.clamp(-1.0, 1.0)

    @torch.no_grad()
    def decode_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """One sequence: codes [T, Q] -> waveform [T * total_upsample]."""
        device = next(self.parameters()).device
        return self(codes.to(device).T[None])[0, 0]


# ----------------------------------------------------------------------------------- the official decode path


@torch.no_grad()
def chunked_decode(decoder: CodecDecoder, codes: torch.Tensor, chunk_size: int = 300,
                   left_context_size: int = 25) -> torch.Tensor:
    """The official windowing: each window of `chunk_size` frames is decoded from scratch with up to
    `left_context_size` earlier frames as context, whose audio is dropped. codes [B, Q, T] -> [B, 1, T*upsample].

    Beyond one window this differs from a single pass: the attention context restarts at every window.
    """
    pieces = []
    start, total = 0, codes.shape[-1]
    while start < total:
        end = min(start + chunk_size, total)
        context = left_context_size if start > left_context_size else start
        wav = decoder(codes[..., start - context: end])
        pieces.append(wav[..., context * decoder.total_upsample:])
        start = end
    return torch.cat(pieces, dim=-1)


@torch.no_grad()
def official_decode(decoder: CodecDecoder, codes: torch.Tensor) -> list[torch.Tensor]:
    """`Qwen3TTSTokenizerV2Model.decode`: codes [B, T, Q] right-padded with -1 -> one waveform per row.

    A row's length is its number of frames whose codebook-0 code is not -1 (padding anywhere counts the same),
    every code is clamped to >= 0, the batch goes through `chunked_decode(300, 25)`, and each row is cut.
    """
    device = next(decoder.parameters()).device
    codes = codes.to(device)
    lengths = (codes[..., 0] > -1).sum(dim=1) * decoder.total_upsample
    wavs = chunked_decode(decoder, codes.clamp(min=0).transpose(1, 2))[:, 0]
    return [w[: int(n)] for w, n in zip(wavs, lengths)]
