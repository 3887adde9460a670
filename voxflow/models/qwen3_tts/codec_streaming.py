"""Stateful streaming decode of the 12 Hz codec: frames in, audio out, equal to one pass over the whole stream.

The decoder is strictly causal but its attention chains back without limit (spec 7.3), so re-decoding a
fixed left context is not exact. Instead each request keeps, with a leading batch dimension:

- per transformer layer: rotated keys and values of its last `sliding_window - 1` frames (fixed size);
- the number of frames consumed (the next absolute RoPE position);
- per causal conv: its last (kernel-1)*dilation input samples;
- per transposed conv with kernel > stride: the kernel-stride partial output sums that spill into the next call,
  and with kernel = 2 x stride also its last input row (what the GPU stack's sub-pixel form carries instead,
  codec_waveform_cl.SUBPIXEL; a stream is decoded by one form throughout).

Every tensor has a fixed size, so a stream can run forever; a call costs work proportional to its new frames
(plus attention over the window). Rows of several requests can be decoded in one call when they feed the same
number of new frames: build a batch state with `CodecStreamState.cat`, split it back with `select`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .codec_decoder import CodecDecoder
from .codec_decoder_blocks import StreamingModule


@dataclass
class CodecStreamState:
    """Streaming context of B requests: name -> tensor [B, ...] (names are the owning modules' weight prefixes)."""

    tensors: dict[str, torch.Tensor]

    @property
    def batch_size(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    @property
    def frames(self) -> torch.Tensor:
        """Frames consumed so far by each request, LongTensor [B]."""
        return self.tensors["pre_transformer.pos"]

    def select(self, rows: torch.Tensor | Sequence[int] | slice) -> "CodecStreamState":
        """The states of some requests (row numbers, a boolean mask or a slice), in that order."""
        if isinstance(rows, torch.Tensor):
            rows = rows.to(self.frames.device)
        elif not isinstance(rows, slice):
            rows = torch.as_tensor(rows, dtype=torch.long, device=self.frames.device)
        return CodecStreamState({k: v[rows] for k, v in self.tensors.items()})

    @staticmethod
    def cat(states: Sequence["CodecStreamState"]) -> "CodecStreamState":
        """One batch state from several (requests may be at different points of their streams)."""
        keys = states[0].tensors.keys()
        if any(s.tensors.keys() != keys for s in states):
            raise ValueError("cannot concatenate stream states of different decoders")
        return CodecStreamState({k: torch.cat([s.tensors[k] for s in states]) for k in keys})

    def to(self, device) -> "CodecStreamState":
        return CodecStreamState({k: v.to(device) for k, v in self.tensors.items()})

    @property
    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.tensors.values())


def init_stream_state(decoder: CodecDecoder, batch_size: int = 1, device=None, dtype=None) -> CodecStreamState:
    """A fresh state for `batch_size` requests that have not fed any frame yet (default: decoder device/dtype)."""
    param = next(decoder.parameters())
    device = param.device if device is None else device
    dtype = param.dtype if dtype is None else dtype
    tensors = {}
    for module in decoder.modules():
        if isinstance(module, StreamingModule):
            tensors.update(module.init_state(batch_size, device, dtype))
    return CodecStreamState(tensors)


@torch.no_grad()
def stream_decode(decoder: CodecDecoder, codes: torch.Tensor,
                  state: CodecStreamState) -> tuple[torch.Tensor, CodecStreamState]:
    """Decode the next T frames of B streams: codes [B, Q, T] -> (waveform [B, 1, T*upsample], new state).

    The given state is left untouched (the new one shares no storage with it that is later written).
    """
    if codes.shape[0] != state.batch_size:
        raise ValueError(f"codes for {codes.shape[0]} requests, state for {state.batch_size}")
    if codes.shape[-1] == 0:
        return codes.new_zeros((codes.shape[0], 1, 0), dtype=next(decoder.parameters()).dtype), state
    tensors = state.tensors.copy()      # (a StateWriter stays one: codec_pool's step)
    wav = decoder(codes, tensors)
    return wav, CodecStreamState(tensors)


class CodecStream:
    """One request's incremental decode: `feed(codes [T, Q]) -> waveform [T*upsample]`, any T per call."""

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        self.state = init_stream_state(decoder, 1)

    def feed(self, codes: torch.Tensor) -> torch.Tensor:
        device = next(self.decoder.parameters()).device
        wav, self.state = stream_decode(self.decoder, codes.to(device).T[None], self.state)
        return wav[0, 0]
