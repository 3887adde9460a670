"""Tempo change without pitch change (the OpenAI `speed` field), incremental.

ffmpeg's `atempo` filter (WSOLA) run through a PyAV filter graph, fed chunk by chunk so it works for streamed
responses too. `speed=2.0` halves the duration, `0.5` doubles it; the pitch stays. One atempo stage is used for
speeds in [0.5, 2.0]; outside that, two equal stages (sqrt(speed) each, within [0.5, 2.0] for the whole range
0.25-4.0), because that is the range atempo was designed for.

Input is cut into fixed 512-sample frames counted from the start of the stream, whatever sizes the caller feeds:
atempo sizes its output buffer from the size of the frame it receives and emits nothing until that buffer is
full (a 2 s chunk would only come out after the next chunk), and a fixed framing also makes the output
independent of how the input was chunked (streamed and whole-file audio are identical). The cost is at most
511 samples of extra delay plus atempo's own window (~40 ms) before output appears.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

SPEED_MIN = 0.25
SPEED_MAX = 4.0

_FRAME = 512  # samples per frame pushed into the graph


def check_speed(speed) -> float:
    """`speed` as a float, or ValueError when it is not a finite number in [0.25, 4.0]."""
    try:
        value = float(speed)
    except (TypeError, ValueError):
        raise ValueError(f"speed must be a number between {SPEED_MIN} and {SPEED_MAX}, got {speed!r}") from None
    if not math.isfinite(value) or not SPEED_MIN <= value <= SPEED_MAX:
        raise ValueError(f"speed must be between {SPEED_MIN} and {SPEED_MAX}, got {speed!r}")
    return value


def atempo_stages(speed: float) -> list[float]:
    """Per-stage atempo factors whose product is `speed`, each in [0.5, 2.0]."""
    speed = check_speed(speed)
    if 0.5 <= speed <= 2.0:
        return [speed]
    root = math.sqrt(speed)  # 0.25..0.5 -> 0.5..0.707, 2..4 -> 1.414..2
    return [root, root]


class Tempo:
    """Incremental tempo change of float32 mono audio at a fixed sample rate.

    `process(x)` returns whatever output is ready (possibly empty), `flush()` the rest at the end of the stream.
    """

    def __init__(self, sample_rate: int, speed: float):
        import av

        self.sample_rate = int(sample_rate)
        self.speed = check_speed(speed)
        self.stages = atempo_stages(self.speed)
        self._av = av
        self._graph = av.filter.Graph()
        nodes = [self._graph.add_abuffer(sample_rate=self.sample_rate, format="flt", layout="mono",
                                         time_base=Fraction(1, self.sample_rate))]
        for stage in self.stages:
            nodes.append(self._graph.add("atempo", tempo=repr(stage)))
        nodes.append(self._graph.add("aformat", sample_fmts="flt", channel_layouts="mono"))
        nodes.append(self._graph.add("abuffersink"))
        self._graph.link_nodes(*nodes).configure()
        self._pending = np.zeros(0, dtype=np.float32)
        self._pts = 0
        self._done = False

    def process(self, x: np.ndarray) -> np.ndarray:
        if self._done:
            raise RuntimeError("Tempo.process() after flush()")
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if self._pending.size:
            x = np.concatenate([self._pending, x])
        n_full = (x.size // _FRAME) * _FRAME
        self._pending = x[n_full:].copy()
        out = []
        for start in range(0, n_full, _FRAME):
            self._push(x[start:start + _FRAME])
            out.extend(self._pull())
        return _concat(out)

    def flush(self) -> np.ndarray:
        if self._done:
            return np.zeros(0, dtype=np.float32)
        self._done = True
        out = []
        if self._pending.size:
            self._push(self._pending)
            out.extend(self._pull())
            self._pending = np.zeros(0, dtype=np.float32)
        self._graph.push(None)
        out.extend(self._pull())
        return _concat(out)

    def _push(self, samples: np.ndarray) -> None:
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[None, :]), format="flt",
                                                 layout="mono")
        frame.sample_rate = self.sample_rate
        frame.time_base = Fraction(1, self.sample_rate)
        frame.pts = self._pts
        self._pts += samples.size
        self._graph.push(frame)

    def _pull(self) -> list[np.ndarray]:
        """Every frame the graph has ready (EAGAIN: needs more input; EOF: flushed completely)."""
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (EOFError, self._av.error.BlockingIOError):
                break
            out.append(frame.to_ndarray().reshape(-1))
        return out


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


__all__ = ["SPEED_MIN", "SPEED_MAX", "check_speed", "atempo_stages", "Tempo"]
