"""Building blocks of the 12 Hz codec decoder: RVQ dequantiser, causal convolutions, SnakeBeta, upsampling blocks.

Every block runs in two modes through the same `forward(x, state=None)`:

- `state is None`: a single pass over a whole sequence, zero left padding, exactly the official computation.
- `state` is a dict of per-request tensors (leading batch dimension): the block reads the left context it
  needs from its own entry (`self.state_key`), computes only the new samples and writes back the context the
  next call will need. Feeding a sequence in pieces this way reproduces the single pass (up to float rounding),
  because every layer of the decoder is causal.

`state_key` is the module's qualified name inside `CodecDecoder`, assigned when the decoder is built.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.derived_weights import per_weight_version

StreamTensors = dict[str, torch.Tensor]


class StateWriter(dict):
    """A decode's stream state whose new tensors go straight into preallocated slots - the codec pool's packed
    write-back rows (codec_pool.PackedRows) - instead of into tensors of their own that the write-back then packs
    with a cat (one ~114 us copy of every state byte in a 16-stream call on an H100, session 39). Reads give the
    state the decode started from until a key is written, then its slot. `written` names the keys written."""

    def __init__(self, tensors: StreamTensors, slots: StreamTensors):
        super().__init__(tensors)
        self.slots = slots
        self.written: set[str] = set()

    def copy(self) -> "StateWriter":
        other = StateWriter(self, self.slots)
        other.written = set(self.written)
        return other

    def slot(self, key: str) -> torch.Tensor:
        """key's slot, for a kernel to write the new value into (read the old one first): from now on state[key]."""
        self[key] = self.slots[key]
        self.written.add(key)
        return self.slots[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        # A value assigned past `slot` / `keep` is not in its slot: the write-back copies it there (write_slots)
        if value is not self.slots.get(key):
            self.written.discard(key)
        super().__setitem__(key, value)


def new_value(state: StreamTensors, key: str, like: torch.Tensor) -> torch.Tensor:
    """Where a kernel is to write state[key]'s next value (read the old one first): a StateWriter's slot, else a new
    tensor like `like`, which becomes state[key]."""
    if isinstance(state, StateWriter):
        return state.slot(key)
    state[key] = out = torch.empty_like(like, memory_format=torch.contiguous_format)
    return out


def keep(state: StreamTensors, key: str, value: torch.Tensor, owned: bool = False) -> None:
    """state[key] = value as the stream's carried tensor: copied into its slot for a StateWriter, else a contiguous
    copy of its own (value is usually a view into this call's activations, which the state must not keep alive),
    or value itself where `owned` (a new tensor nothing else holds)."""
    if isinstance(state, StateWriter):
        state.slot(key).copy_(value)
    else:
        state[key] = value if owned else value.clone(memory_format=torch.contiguous_format)


class StreamingModule(nn.Module):
    """A block that carries context between streaming calls."""

    state_key: str = ""

    def init_state(self, batch: int, device, dtype) -> StreamTensors:
        """The context of a stream that has not seen any frame yet (equivalent to zero padding)."""
        return {}


# --------------------------------------------------------------------------------------------- convolutions


class CausalConv1d(StreamingModule):
    """Stride-1 convolution that only looks back: (kernel-1)*dilation samples of left context, none ahead.

    The official class also pads on the right "to complete the last stride", which is zero for stride 1; every
    convolution of the decoder has stride 1, so the output length always equals the input length.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation
        self._derived: tuple | None = None     # the weight as the channels-last kernel reads it (codec_waveform_cl)

    def init_state(self, batch, device, dtype):
        if self.context == 0:
            return {}
        return {self.state_key: torch.zeros(batch, self.conv.in_channels, self.context, device=device, dtype=dtype)}

    def with_context(self, x: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
        """x with its left context in front (zeros, or the stream's carried samples, which it then replaces)."""
        if self.context and state is None:
            return F.pad(x, (self.context, 0))
        if self.context:
            x = torch.cat([state[self.state_key], x], dim=-1)
            keep(state, self.state_key, x[..., x.shape[-1] - self.context:])
        return x

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None, bias: bool = True, padded: bool = False
                ) -> torch.Tensor:
        """bias=False: the output without the bias (a caller that adds it inside its next fused pass).
        padded=True: x already starts with the left context (`with_context`), and `state` is not used."""
        if not padded:
            x = self.with_context(x, state)
        c = self.conv
        if c.out_channels == 1 and c.groups == 1 and x.dtype != torch.float32 and use_kernels(x):
            from voxflow.layers.one_channel_conv import one_channel_conv1d     # the final layer (see its docstring)
            return one_channel_conv1d(x, c.weight, c.bias if bias else None, c.dilation[0])
        k = c.kernel_size[0]
        if c.groups == 1 and k > 1 and use_kernels(x):
            from voxflow.layers import conv_im2col          # low-rate layers: one GEMM beats cuDNN's pick
            if conv_im2col.fits(x, k):
                return conv_im2col.conv1d_im2col(x, c.weight, c.bias if bias else None, c.dilation[0])
        if bias:
            return self.conv(x)
        return F.conv1d(x, c.weight, None, c.stride, 0, c.dilation, c.groups)


class CausalConvTranspose1d(StreamingModule):
    """ConvTranspose1d(kernel, stride) keeping exactly T*stride outputs (the last kernel-stride are dropped).

    Output sample n gets contributions from inputs t with 0 <= n - t*stride < kernel. With kernel <= 2*stride a new
    input frame only adds to its own stride of samples and to the next one, so streaming keeps the `overlap` =
    kernel-stride partial sums that spill past the emitted samples and adds them to the next call's first ones.
    With kernel = 2*stride the state also holds the last input row (`x_state_key`), the context of the GPU stack's
    sub-pixel form (codec_waveform_cl.SUBPIXEL), which carries that instead of the spill; each form keeps its own
    entry (2,880 values a stream for the 12 Hz decoder, allocated with either form).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        if not stride <= kernel_size <= 2 * stride:
            raise ValueError(f"causal transposed conv needs stride <= kernel <= 2*stride, got {kernel_size}/{stride}")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride
        # kernel == 2 x stride (every upsampling block of the 12 Hz decoder): the GPU stack may run it as a two-tap
        # convolution (codec_waveform_cl.SUBPIXEL), which carries the last input row instead of the spill
        self.subpixel = kernel_size == 2 * stride
        self._derived: tuple | None = None     # the weight as one GEMM operand (codec_waveform_cl)

    @property
    def x_state_key(self) -> str:
        """The sub-pixel form's context: the previous call's last input row [B, Cin, 1]."""
        return self.state_key + ".x"

    def init_state(self, batch, device, dtype):
        if self.overlap == 0:
            return {}
        state = {self.state_key: torch.zeros(batch, self.conv.out_channels, self.overlap, device=device, dtype=dtype)}
        if self.subpixel:
            state[self.x_state_key] = torch.zeros(batch, self.conv.in_channels, 1, device=device, dtype=dtype)
        return state

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        if use_kernels(x):
            # On the GPU: one GEMM + overlap-add instead of cuDNN's slow transposed-convolution kernel.
            from voxflow.layers.conv_transpose_gemm import conv_transpose_gemm
            streaming = state is not None and self.overlap > 0
            y, tail = conv_transpose_gemm(x, self.conv.weight, self.conv.bias, self.stride,
                                          state[self.state_key] if streaming else None)
            if streaming:
                keep(state, self.state_key, tail, owned=True)
            return y
        if state is None or self.overlap == 0:
            y = self.conv(x)
            return y[..., : y.shape[-1] - self.overlap]
        # The carried tail holds partial sums, so the bias is added once, after the overlap-add.
        y = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)
        n = x.shape[-1] * self.stride
        head = y[..., : self.overlap] + state[self.state_key]
        keep(state, self.state_key, y[..., n:])
        y = torch.cat([head, y[..., self.overlap: n]], dim=-1)
        return y + self.conv.bias[:, None]


# ------------------------------------------------------------------------------------- activation and blocks


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta (alpha and beta are stored as logarithms). Pointwise: no state.

    On CUDA (kernel switch on) one Triton pass instead of five element-wise kernels, same bits
    (voxflow/kernels/snake_beta.py); its per-channel terms are computed by the same torch ops, once per weight
    version, outside any CUDA-graph capture."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._derived: tuple | None = None

    def _channel_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(e^alpha, 1 / (e^beta + 1e-9)) per channel, exactly as forward's torch expression forms them."""
        return per_weight_version(self, (self.alpha, self.beta),
                                  lambda: (torch.exp(self.alpha), 1.0 / (torch.exp(self.beta) + 1e-9)))

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
        """bias [C]: x is a convolution's output still without its bias (added first, in the same pass)."""
        if use_kernels(x):
            from voxflow.kernels import snake_beta as fused   # imported lazily: CPU runs never load Triton code
            a, inv = self._channel_terms()
            if fused.supported(x, a, inv, bias):
                return fused.snake_beta(x, a, inv, bias)
        if bias is not None:
            x = x + bias[:, None]
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k=7), LayerNorm, 4x GELU MLP, per-channel gain, residual. Runs at frame rate x2/x4."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)  # [B, T, C] for the channel-wise norm and MLP
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k=7 (dilated) -> SnakeBeta -> conv k=1, plus the input."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        if use_kernels(x):
            # Both convolutions' biases ride along in the next fused pass (act2's SnakeBeta, the residual add) instead
            # of PyTorch's separate broadcast add after each convolution; same rounding points, same values.
            from voxflow.kernels import snake_beta as fused
            h = self.act2(self.conv1(self._act1_with_context(x, state), None, bias=False, padded=True),
                          bias=self.conv1.conv.bias)
            h = self.conv2(h, state, bias=False)
            if fused.bias_residual_supported(h, self.conv2.conv.bias, x):
                return fused.bias_residual(h, self.conv2.conv.bias, x)
            return (h + self.conv2.conv.bias[:, None]) + x
        h = self.conv1(self.act1(x), state)
        h = self.conv2(self.act2(h), state)
        return h + x

    def _act1_with_context(self, x: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
        """act1(x) written straight after conv1's left context (the stream's carried samples, or zeros) in one
        buffer, which conv1 then reads unpadded: the concatenation's copy of the whole activation is saved. The
        stream's new context is taken from the buffer's end."""
        from voxflow.kernels import snake_beta as fused
        ctx = self.conv1.context
        a, inv = self.act1._channel_terms()
        if not fused.supported(x, a, inv):
            return self.conv1.with_context(self.act1(x), state)
        b, c, t = x.shape
        buf = torch.empty(b, c, ctx + t, dtype=x.dtype, device=x.device)
        if state is None:
            buf[..., :ctx].zero_()
        else:
            buf[..., :ctx].copy_(state[self.conv1.state_key])
        fused.snake_beta(x, a, inv, out=buf[..., ctx:])
        if state is not None:
            keep(state, self.conv1.state_key, buf[..., t:])
        return buf


class DecoderBlock(nn.Module):
    """One waveform upsampling stage: SnakeBeta, causal transposed conv (x rate, channels halved), 3 residual units
    with dilations 1, 3, 9. Kept as a list named `block` so the weight names match the checkpoint."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([
            SnakeBeta(in_dim),
            CausalConvTranspose1d(in_dim, out_dim, kernel_size=2 * rate, stride=rate),
            *(ResidualUnit(out_dim, d) for d in (1, 3, 9)),
        ])

    def forward(self, x: torch.Tensor, state: StreamTensors | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x


# ------------------------------------------------------------------------------------------ RVQ dequantiser


class Codebook(nn.Module):
    """EMA codebook as stored by training: the entries are embedding_sum / cluster_usage.

    The division is done once per weight version and kept (the same tensor ops, so the same values), not in every
    decode call; never kept when first made inside a CUDA-graph capture (graph-pool memory)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self._derived: tuple | None = None

    def embeddings(self) -> torch.Tensor:
        return per_weight_version(self, (self.cluster_usage, self.embedding_sum), self.compute_embeddings)

    def compute_embeddings(self) -> torch.Tensor:
        """The entries, computed (not kept): embedding_sum / cluster_usage."""
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _CodebookHolder(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _CodebookList(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_CodebookHolder(size, dim) for _ in range(n))


# The codec's frame-rate part in fewer launches on a GPU, each with the plain path's values: the dequantiser's
# lookups and sum (kernels/rvq_lookup.py), the attention's key / value window (kv_window.py), each LayerScale'd
# residual add with the norm after it (rms_norm.py); and the RoPE tables with the next positions (rope_table.py,
# within rounding of PyTorch's cos / sin; since session 39). Session 39 (H100), with the state pool's row copies:
# a 16-stream codec call 2.98 -> 2.34 ms at 1 frame, 15.14 -> 14.34 ms at 25. VOXFLOW_CODEC_FRAME_KERNELS=0:
# PyTorch's operations (and the standalone norm kernel) for all of them.
FRAME_KERNELS = os.environ.get("VOXFLOW_CODEC_FRAME_KERNELS", "1") == "1"


class ResidualDequantizer(nn.Module):
    """Sum of the looked-up entries of several codebooks, projected by a 1x1 conv.

    `input_proj` only serves the encoding direction; it is kept so real checkpoints load strictly.
    """

    def __init__(self, n_codebooks: int, codebook_size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _CodebookList(n_codebooks, codebook_size, dim)
        self._derived: tuple | None = None     # the stacked table of `table()`

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> [B, io_dim, T]"""
        if FRAME_KERNELS and use_kernels(codes):
            # one Triton pass for the K lookups and their sum, same order and bits (voxflow/kernels/rvq_lookup.py)
            from voxflow.kernels import rvq_lookup as fused
            table = self.table()
            if fused.supported(codes, table):
                return self.output_proj(fused.rvq_lookup(codes, table).transpose(1, 2))
        total = 0
        for k, holder in enumerate(self.vq.layers):  # K is small (1 or 15); summed in codebook order like training
            total = total + F.embedding(codes[:, k], holder._codebook.embeddings())
        return self.output_proj(total.transpose(1, 2))

    def table(self) -> torch.Tensor:
        """Every codebook's entries as one [K, size, dim] table (Codebook's own expression), kept per weight
        version."""
        books = [holder._codebook for holder in self.vq.layers]
        params = tuple(p for book in books for p in (book.cluster_usage, book.embedding_sum))
        return per_weight_version(self, params, lambda: torch.stack([book.compute_embeddings() for book in books]))


class SplitDequantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have separate output projections; the results add."""

    def __init__(self, n_codebooks: int, n_semantic: int, codebook_size: int, dim: int, io_dim: int):
        super().__init__()
        self.n_semantic = n_semantic
        self.rvq_first = ResidualDequantizer(n_semantic, codebook_size, dim, io_dim)
        self.rvq_rest = ResidualDequantizer(n_codebooks - n_semantic, codebook_size, dim, io_dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first(codes[:, : self.n_semantic]) + self.rvq_rest(codes[:, self.n_semantic:])
