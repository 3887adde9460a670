"""The codec decoder's waveform stack on the GPU in channels-last layout: `CodecDecoder.decoder` (the first
convolution, the four SnakeBeta upsampling blocks, the last SnakeBeta and the one-channel output convolution) with
activations held as [B, T, C] rows between the layers.

Why: these layers hold ~95% of the decoder's arithmetic (~4.8 of 5.0 GFLOP a frame) and activations up to 96
channels x 1920 samples a frame; in [B, C, T] layout each convolution went through cuDNN with layout conversions and
every bias, activation and residual add was a separate pass. Channels-last, a residual unit is three passes: the
first SnakeBeta (written after the dilated convolution's left context), the dilated convolution with its bias and
the second SnakeBeta in its epilogue, the 1x1 convolution with its bias and the residual add in its epilogue
(voxflow/kernels/causal_conv.py); a transposed convolution is one GEMM whose rows are already channels-last, or
with SUBPIXEL one two-tap convolution (`_conv_transpose_subpixel`). With ACT_IN_EPILOGUE the SnakeBeta that starts
the next unit or block is applied by the kernel before it (the 1x1 convolution's epilogue, the overlap-add), which
writes it after the next layer's left context: no pass of its own.

Same modules, same weights, same streaming state as the plain path (codec_decoder_blocks.py): each convolution's
carried left context stays [B, C, context] in the state (read and written transposed: at most 54 samples), the
transposed convolutions' spill [B, C, overlap] (the sub-pixel form carries their last input row [B, Cin, 1] under
its own key instead: a stream is decoded by one path throughout). The GPU tests hold this path to the plain PyTorch
decoder.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.derived_weights import per_weight_version

from .codec_decoder_blocks import (CausalConv1d, CausalConvTranspose1d, DecoderBlock, ResidualUnit, SnakeBeta,
                                   StreamTensors, keep, new_value)

ENABLED = True          # tests turn it off to hold the [B, C, T] kernel path to the plain decoder on its own
# The upsampling blocks' transposed convolutions (kernel = 2 x stride) as two-tap convolutions in sub-pixel form
# (`_conv_transpose_subpixel`) instead of a GEMM + overlap-add pass; on by default since session 39: the codec alone
# (16 streams, fp16, 64 SMs, H100) 13.18 -> 12.67 ms a 25-frame call and 2.17 -> 2.11 ms a 1-frame call (with
# ACT_IN_EPILOGUE 2), and it no longer costs memory (0.6B c=64 peak 7.65 GiB with and without, the graph pools'
# reserve alike: session 28's +0.73 GiB of fragmentation went, likely with the codec graphs' largest-first capture of
# session 37); served 0.6B c=64 within the noise (703.9 / 703.3 without, 700.6 / 705.9 with).
# VOXFLOW_CODEC_SUBPIXEL=0: the GEMM form.
SUBPIXEL = os.environ.get("VOXFLOW_CODEC_SUBPIXEL", "1") == "1"
# A layer's SnakeBeta applied by the kernel that makes its input (`_conv_into`, `_conv_transpose`) instead of in a
# pass of its own, which reads and writes the whole activation (17 such passes were 13% of a 16-stream 25-frame
# codec call's kernel time on the H200, session 28 call 2). 1: where that kernel's output is read only activated -
# each block's last residual unit's 1x1 convolution, before the next block's transposed convolution or the last
# SnakeBeta (4 passes, a quarter of their bytes); 2: also before every residual unit, whose input is also its
# residual, so the kernel stores it twice: the other units' 1x1 convolutions and the transposed convolutions'
# overlap-add pass or sub-pixel convolution (12 more passes, each now one extra store instead of a read and a
# store). The first block's SnakeBeta keeps its pass. The moved SnakeBetas take the convolution epilogues' sin
# (sin.approx on a GPU where the products are inexact, as conv1's own SnakeBeta epilogue: causal_conv.py), so on a
# GPU the audio is not bit-equal to level 0's, only as close as that (the fp16 SNR test holds it). With the fused
# residual unit (residual_unit.ENABLED, fp32 / bf16) its output keeps a pass. 2 by default since session 39 (H100,
# benchmarks/results/h100/2026-12-05-session39): the codec alone 14.34 -> 13.18 ms a 16-stream 25-frame call (level
# 1: 15.19, slower: the activation costs the TMA kernel registers without saving many bytes), 2.34 -> 2.17 ms a
# 1-frame call; 0.6B c=64 707.2 / 703.9 / 703.3 against 699.7 / 704.4 / 699.3 / 699.3 at 0; 1.7B c=1 unchanged.
# VOXFLOW_CODEC_ACT_EPILOGUE=0 or 1 for the other levels.
ACT_IN_EPILOGUE = int(os.environ.get("VOXFLOW_CODEC_ACT_EPILOGUE", "2"))
# Each streamed convolution's left context into its input buffer and the next one out to the state in one launch
# (kernels/context_exchange.py) instead of two transposing copies: ~21 launches fewer a codec call (session 39,
# counted on a CPU). The same bits. On by default; session 40 (H100): a 16-stream call's kernel time 1.42 -> 1.38 ms
# at 1 frame, 10.96 -> 10.84 at 25 (benchmarks/results/h100/2026-12-05-session40). VOXFLOW_CODEC_CONTEXT_KERNEL=0:
# copies.
CONTEXT_KERNEL = os.environ.get("VOXFLOW_CODEC_CONTEXT_KERNEL", "1") == "1"
# The first convolution (latent -> 1536 channels, k=7, at 4 samples a frame) channels-last on the TMA kernel with
# tiles across sequences (causal_conv.CONV_TMA_FLAT), the first block's SnakeBeta in its epilogue, where that kernel
# takes it, instead of im2col + cuBLAS GEMM + bias add + two transposing copies + a SnakeBeta pass (~210 us of a
# 16-stream 25-frame call on an H100's 64 SMs, session 54). Off by default: session 55 timed it only together with
# ONE_CHANNEL_KERNEL and CONV_TMA_FLAT (the codec call -0.17 ms at 25 frames, about what the one-channel kernel
# saves alone); VOXFLOW_CODEC_FIRST_CONV_CL=1 turns it on.
FIRST_CONV_CL = os.environ.get("VOXFLOW_CODEC_FIRST_CONV_CL", "0") == "1"
# The last convolution (96 -> 1 channel) on its own bandwidth-bound kernel (kernels/one_channel_conv_cl.py) instead
# of the implicit GEMM's 16-column tiles. On by default since session 55 (H100, 64 SMs, 16 streams x 25 frames,
# benchmarks/results/h100/2026-12-07-session55/call1): the layer 291.7 -> 160.4 us; the whole codec call with it
# (and FIRST_CONV_CL and causal_conv.CONV_TMA_FLAT, not timed apart) 10.39 / 10.30 -> 10.21 / 10.13 ms at 25 frames,
# 1.78 -> 1.78 at 1 frame. VOXFLOW_CODEC_ONE_CHANNEL_KERNEL=0: the implicit GEMM.
ONE_CHANNEL_KERNEL = os.environ.get("VOXFLOW_CODEC_ONE_CHANNEL_KERNEL", "1") == "1"


def supported(x: torch.Tensor) -> bool:
    """On CUDA with kernels on, fp32 / bf16 / fp16, and no autograd graph to record (the Triton kernels have no
    backward)."""
    if not (ENABLED and use_kernels(x)):
        return False
    from voxflow.kernels.causal_conv import supported as kernels_take
    return kernels_take(x)


class _Input(NamedTuple):
    """How a layer that starts with a SnakeBeta reads its input: act(x) in a [B, ctx + T, C] buffer after ctx rows
    of left context, carried between calls in state[key] as [B, C, ctx] (ctx 0: the buffer is act(x) alone)."""
    act: SnakeBeta
    ctx: int
    key: str


def _block_input(block: DecoderBlock) -> _Input:
    act, up = block.block[:2]
    return _Input(act, 1, up.x_state_key) if SUBPIXEL and up.subpixel else _Input(act, 0, "")


def _unit_input(unit: ResidualUnit) -> _Input:
    return _Input(unit.act1, unit.conv1.context, unit.conv1.state_key)


def waveform_stack(layers: nn.ModuleList, h: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
    """`for layer in layers: h = layer(h, state)` for CodecDecoder.decoder, channels-last inside:
    h [B, latent, T] -> waveform [B, 1, T * upsample] (not yet clamped)."""
    first, *blocks, act, out_conv = layers
    inputs = [_block_input(block) for block in blocks] + [_Input(act, out_conv.context, out_conv.state_key)]
    buf = _first_conv(first, h, inputs[0], state)
    for block, following in zip(blocks, inputs[1:]):
        buf = _block(block, buf, following, state)
    y = _out_conv(out_conv, buf)                                                                # [B, T, 1]
    return y.view(y.shape[0], 1, y.shape[1])


def _first_conv(conv: CausalConv1d, h: torch.Tensor, following: _Input, state: StreamTensors | None
                ) -> torch.Tensor:
    """The low-rate first convolution on h [B, latent, T] -> the first block's activated input (following's
    buffer). With FIRST_CONV_CL, where the TMA kernel takes it: h with its context turned to rows once (copied as
    rows where h is a view of rows), the convolution channels-last with the block's SnakeBeta in its epilogue.
    Else (the default) the im2col GEMM in [B, C, T] (conv_im2col.py), its output turned to rows, and a SnakeBeta
    pass."""
    if FIRST_CONV_CL:
        from voxflow.kernels.causal_conv import conv1d_channels_last, takes_tma
        packed = _packed(conv)
        b, latent, t = h.shape
        # its rows [B, ctx + T, latent], filled only if the TMA kernel takes them (no copy for the im2col path)
        x = torch.empty((b, conv.context + t, latent), dtype=h.dtype, device=h.device)
        if takes_tma(x, packed, t):
            if h.stride(1) == 1:
                # h is a [B, C, T] view of rows (codec_upsample_cl.py): a row copy, the context in and out in one
                # launch (`_context_rows`), no transposing copy
                x[:, conv.context:].copy_(h.transpose(1, 2))
                _context_rows(conv.context, conv.state_key, x, t, state)
            else:
                x.copy_(conv.with_context(h, state).transpose(1, 2))    # `state` now holds the next context
            terms = following.act._channel_terms()
            return _filled(following, b, t, conv.conv.out_channels, x, state, lambda rows: conv1d_channels_last(
                x, packed, conv.conv.bias, conv.conv.dilation[0], activation=terms, out=rows))[0]
    y = conv(h, state)
    return _activated(following, y.transpose(1, 2).contiguous(), state)


def _block(block: DecoderBlock, buf: torch.Tensor, following: _Input, state: StreamTensors | None) -> torch.Tensor:
    """An upsampling block on its activated input (`_block_input`'s buffer) -> the activated input of the layer
    after it (`following`'s buffer)."""
    _, up, *units = block.block
    transposed = _conv_transpose_subpixel if SUBPIXEL and up.subpixel else _conv_transpose
    x, buf = transposed(up, buf, _unit_input(units[0]), state)
    for i, unit in enumerate(units):
        last = i == len(units) - 1
        x, buf = _residual_unit(unit, x, buf, following if last else _unit_input(units[i + 1]), not last, state)
    return buf


def _residual_unit(unit: ResidualUnit, x: torch.Tensor, buf: torch.Tensor, following: _Input, keep_output: bool,
                   state: StreamTensors | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The unit on x, given buf (`_unit_input`'s buffer of x) -> (its output y where keep_output, following's
    buffer of y)."""
    from voxflow.kernels import residual_unit, residual_unit_tma
    w7 = _packed(unit.conv1)
    if residual_unit_tma.fits(buf, w7, x.shape[1]):
        # both convolutions in one fp16 TMA kernel, with the 1x1's epilogue (residual_unit_tma.py)
        return _into(lambda **epilogue: residual_unit_tma.residual_unit_tma(
            buf, w7, unit.conv1.conv.bias, unit.conv1.conv.dilation[0], unit.act2._channel_terms(),
            _packed(unit.conv2), unit.conv2.conv.bias, x, **epilogue), *x.shape, x, following, keep_output, state)
    if residual_unit.ENABLED and residual_unit.supported(x, x.shape[2], unit.conv1.conv.kernel_size[0]):
        # both convolutions in one kernel: h stays on the SM (residual_unit.py)
        y = residual_unit.residual_unit_channels_last(
            buf, w7, unit.conv1.conv.bias, unit.conv1.conv.dilation[0], unit.act2._channel_terms(),
            _packed(unit.conv2), unit.conv2.conv.bias, x)
        return y, _activated(following, y, state)
    h = _conv(unit.conv1, buf, snake_terms=unit.act2._channel_terms())
    return _conv_into(unit.conv2, h, following, keep_output, state, residual=x)


def _conv_into(conv: CausalConv1d, x: torch.Tensor, following: _Input, keep_output: bool,
               state: StreamTensors | None, **epilogue) -> tuple[torch.Tensor | None, torch.Tensor]:
    """y = conv(x) (with its epilogue), and following's buffer of y -> (y where keep_output, the buffer). With
    ACT_IN_EPILOGUE the convolution writes following.act(y) into the buffer itself (and y where kept)."""
    from voxflow.kernels.causal_conv import conv1d_channels_last
    return _into(lambda **more: conv1d_channels_last(x, _packed(conv), conv.conv.bias, conv.conv.dilation[0],
                                                     **epilogue, **more),
                 x.shape[0], x.shape[1] - conv.context, conv.conv.out_channels, x, following, keep_output, state)


def _into(run, b: int, t: int, c: int, like: torch.Tensor, following: _Input, keep_output: bool,
          state: StreamTensors | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """y [B, T, C] = run() and following's buffer of y -> (y where keep_output, the buffer). `run(activation=,
    out=, raw_out=)` makes y with conv1d_channels_last's epilogue options; with ACT_IN_EPILOGUE it writes
    following.act(y) into the buffer itself (and y where kept)."""
    if ACT_IN_EPILOGUE < (2 if keep_output else 1):
        y = run()
        return y, _activated(following, y, state)
    y = torch.empty((b, t, c), dtype=like.dtype, device=like.device) if keep_output else None
    buf, _ = _filled(following, b, t, c, like, state, lambda rows: run(
        activation=following.act._channel_terms(), out=rows, raw_out=y))
    return y, buf


def _activated(inp: _Input, x: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
    """inp's buffer of x [B, T, C], act(x) written by a SnakeBeta pass (`_filled`)."""
    from voxflow.kernels.causal_conv import snake_channels_last
    return _filled(inp, *x.shape, x, state, lambda rows: snake_channels_last(x, *inp.act._channel_terms(), out=rows))[0]


def _filled(inp: _Input, b: int, t: int, c: int, like: torch.Tensor, state: StreamTensors | None, write
            ) -> tuple[torch.Tensor, object]:
    """inp's buffer [B, ctx + T, C] in like's dtype and device: act(x) as `write(rows)` puts it into its last T
    rows, then its first ctx rows the context carried in state[inp.key] (zeros without a state) and the stream's
    next context taken from the buffer's end -> (the buffer, what `write` returned)."""
    buf = torch.empty((b, inp.ctx + t, c), dtype=like.dtype, device=like.device)
    written = write(buf[:, inp.ctx:])
    _context_rows(inp.ctx, inp.key, buf, t, state)
    return buf, written


def _context_rows(ctx: int, key: str, buf: torch.Tensor, t: int, state: StreamTensors | None) -> None:
    """buf [B, ctx + T, C], its last T rows written: its first ctx rows <- the context carried in state[key] (zeros
    without a state), and the stream's next context <- the buffer's end."""
    if state is None:
        buf[:, :ctx].zero_()
    elif ctx:
        old = state[key]
        if CONTEXT_KERNEL:
            # the context in and the next one out in one launch (kernels/context_exchange.py), not two copies
            from voxflow.kernels.context_exchange import exchange_context
            exchange_context(buf, old, new_value(state, key, old))
        else:
            buf[:, :ctx].copy_(old.transpose(1, 2))
            keep(state, key, buf[:, t:].transpose(1, 2))


def _packed(conv: CausalConv1d) -> torch.Tensor:
    """The conv's weight as the channels-last kernels read it ([k, Cout, Cin]), kept per weight version."""
    from voxflow.kernels.causal_conv import pack_weight
    weight = conv.conv.weight
    return per_weight_version(conv, (weight,), lambda: pack_weight(weight))


def _conv(conv: CausalConv1d, x: torch.Tensor, **epilogue) -> torch.Tensor:
    from voxflow.kernels.causal_conv import conv1d_channels_last
    return conv1d_channels_last(x, _packed(conv), conv.conv.bias, conv.conv.dilation[0], **epilogue)


def _out_conv(conv: CausalConv1d, x: torch.Tensor) -> torch.Tensor:
    """The last convolution, to one channel: its own kernel with ONE_CHANNEL_KERNEL, else the implicit GEMM."""
    if not ONE_CHANNEL_KERNEL:
        return _conv(conv, x)
    from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
    return conv1d_to_one_channel(x, _packed(conv), conv.conv.bias, conv.conv.dilation[0])


def subpixel_weight(weight: torch.Tensor, bias: torch.Tensor | None, stride: int
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A transposed convolution's weight [Cin, Cout, 2 * stride] as a two-tap convolution's packed weight
    [2, stride * Cout, Cin] (conv1d_channels_last's layout), and its bias tiled to [stride * Cout].

    Output sample t * s + j (phase j < s) of the transposed convolution is x[t] @ W[:, :, j] + x[t-1] @ W[:, :, s+j]
    + bias: a valid two-tap convolution over [x[t-1], x[t]] whose output row t holds the s phases side by side
    (column j * Cout + c), so [B, T, s * Cout] is already [B, T * s, Cout] in memory. Tap 0 (the earlier row) takes
    W[:, :, s:], tap 1 W[:, :, :s]."""
    cin, cout, k = weight.shape
    if k != 2 * stride:
        raise ValueError(f"the sub-pixel form needs kernel == 2 * stride, got {k} / {stride}")
    late, early = weight[:, :, :stride], weight[:, :, stride:]          # on x[t], on x[t - 1]
    packed = torch.stack([early.permute(2, 1, 0).reshape(stride * cout, cin),
                          late.permute(2, 1, 0).reshape(stride * cout, cin)]).contiguous()
    return packed, (bias.repeat(stride) if bias is not None else None)


def _conv_transpose_subpixel(up: CausalConvTranspose1d, buf: torch.Tensor, following: _Input,
                             state: StreamTensors | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal transposed conv as one two-tap convolution (`subpixel_weight`) on buf [B, 1 + T, Cin], its
    activated input after one row of left context: the previous call's last activated input row
    (state[up.x_state_key], `_block_input`), not the partial sums the GEMM form carries -> (y [B, T * stride, Cout],
    following's buffer of y). No G intermediate, no overlap-add pass. The two taps are summed in fp32 and rounded
    once (the GEMM form rounds each tap's product before the add). With ACT_IN_EPILOGUE 2 the convolution's
    epilogue also writes following.act(y) into the buffer (its terms tiled like the bias: column j * Cout + c)."""
    from voxflow.kernels.causal_conv import conv1d_channels_last
    b, t = buf.shape[0], buf.shape[1] - 1
    weight, bias, s = up.conv.weight, up.conv.bias, up.stride
    cout = weight.shape[1]
    params = (weight,) if bias is None else (weight, bias)
    packed, tiled = per_weight_version(up, params, lambda: subpixel_weight(weight, bias, s), tag="subpixel")
    if ACT_IN_EPILOGUE < 2:
        y = conv1d_channels_last(buf, packed, tiled, 1).view(b, t * s, cout)
        return y, _activated(following, y, state)
    act = following.act
    terms = per_weight_version(act, (act.alpha, act.beta), lambda: tuple(x.repeat(s) for x in act._channel_terms()),
                               tag=f"tiled x{s}")
    y = torch.empty((b, t * s, cout), dtype=buf.dtype, device=buf.device)
    # [B, T * s, Cout] rows are [B, T, s * Cout] rows in memory: the convolution's output layout
    out, _ = _filled(following, b, t * s, cout, buf, state, lambda rows: conv1d_channels_last(
        buf, packed, tiled, 1, activation=terms, out=rows.view(b, t, s * cout), raw_out=y.view(b, t, s * cout)))
    return y, out


def _conv_transpose(up: CausalConvTranspose1d, x: torch.Tensor, following: _Input, state: StreamTensors | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal transposed conv on channels-last (activated) rows (conv_transpose_gemm.py's GEMM + overlap-add):
    x [B, T, Cin] -> (y [B, T * stride, Cout], following's buffer of y). Weight [Cin, Cout, k] as [Cin, k * Cout],
    so a GEMM row holds each tap's output row, and output row t*s + j is G[t, j] (+ the spill G[t-1, s + j] for
    j < k - s) + bias, added by one Triton pass (two strided PyTorch passes before: ~4 ms of a 64 x 25-frame bf16
    call on the H200); with ACT_IN_EPILOGUE 2 that pass also writes following.act(y) into the buffer."""
    from voxflow.kernels.causal_conv import overlap_add_channels_last
    b, t, cin = x.shape
    weight = up.conv.weight
    cout, k, s, overlap = weight.shape[1], weight.shape[2], up.stride, up.overlap
    packed = per_weight_version(up, (weight,), lambda: weight.permute(0, 2, 1).reshape(cin, k * cout).contiguous())
    g = torch.matmul(x.reshape(b * t, cin), packed).view(b, t, k, cout)     # (TF32: CodecDecoder.forward's)
    tail = state[up.state_key] if state is not None and overlap else None
    if ACT_IN_EPILOGUE >= 2:
        buf, y = _filled(following, b, t * s, cout, x, state, lambda rows: overlap_add_channels_last(
            g, up.conv.bias, s, tail, following.act._channel_terms(), rows))
    else:
        y = overlap_add_channels_last(g, up.conv.bias, s, tail)        # bias + spill in one pass
        buf = _activated(following, y, state)
    if tail is not None:
        keep(state, up.state_key, g[:, -1, s:].transpose(1, 2))
    return y, buf
