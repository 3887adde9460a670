"""Do the talker's stream and the codec's stream run side by side, or does one wait for the other?

H200 session 30's c=1 timeline: the talker's next decode step, launched ~1 ms earlier, started only when the codec
stream's whole call (a graph replay, then a copy of its PCM to pinned host memory) had finished. SMs shared between
the two would slow the talker's kernels, not hold them back; a wait like that is what two streams on one hardware
work queue do (first in, first out), or the legacy default stream's ordering.

This reproduces the pattern with stand-ins and no model: a "codec" graph of LONG small kernels (~2 ms), optionally
followed by a device-to-host copy to pinned memory, is launched on stream B; right after, a "talker" graph of SHORT
kernels (~0.1 ms), optionally preceded by a host-to-device copy, on stream A. The host then waits for A alone and
reports how long A took from its launch (us), against A run by itself. ~A alone: the streams overlap; ~B's time:
A waited for B.

    A (talker): the current (legacy default) stream | a new stream | a new highest-priority stream
    B (codec):  a green context of 64 SMs (as served) | the same on its own work queues ("balanced", where this
                PyTorch can) | a plain new stream (the whole GPU)

Run it again under CUDA_DEVICE_MAX_CONNECTIONS=32 (read at CUDA's start) for the hardware queue count.

    python benchmarks/scripts/probe_stream_overlap.py
"""
from __future__ import annotations

import inspect
import os
import time

import torch

LONG, SHORT, REPS = 600, 30, 5


def graph_of(stream: torch.cuda.Stream, n: int, numel: int, copy_in: bool, copy_out: bool, own_capture: bool):
    """A CUDA graph of n in-place adds on a [numel] tensor, replayed on `stream`, with its copies (outside the
    graph, as the engine does: the talker's inputs in before its replay, the codec's PCM out after its replay).
    Captured as the engine does: the codec's on its own (green-context) stream, the talker's on a side stream
    (the legacy default stream cannot capture)."""
    capture = stream if own_capture else torch.cuda.Stream()
    x = torch.zeros(numel, device="cuda")
    host_in = torch.ones(numel, pin_memory=True)
    host_out = torch.empty(numel, pin_memory=True)
    torch.cuda.synchronize()
    stream.synchronize()
    with torch.cuda.stream(capture):
        for _ in range(2):
            for _ in range(n):
                x.add_(1.0)
    capture.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        for _ in range(n):
            x.add_(1.0)
    capture.synchronize()
    torch.cuda.synchronize()

    def run():
        with torch.cuda.stream(stream):
            if copy_in:
                x.copy_(host_in, non_blocking=True)
            g.replay()
            if copy_out:
                host_out.copy_(x, non_blocking=True)
    return run


def timed(run, stream) -> float:
    """us from the host's launch to the end of `run`'s work on `stream`."""
    return launch_and_wait(run, stream)[1]


def launch_and_wait(run, stream) -> tuple[float, float]:
    """(us the host spent in the launch itself, us from the launch to the end of `run`'s work on `stream`): a
    long first number is a host that blocked inside the launch, a long second alone a GPU that held the work."""
    t = time.perf_counter()
    run()
    launched = time.perf_counter()
    stream.synchronize()
    return (launched - t) * 1e6, (time.perf_counter() - t) * 1e6


def talker_streams() -> dict:
    _, greatest = torch.cuda.Stream.priority_range()
    return {"default": torch.cuda.current_stream(), "new": torch.cuda.Stream(),
            "high-priority": torch.cuda.Stream(priority=greatest)}


_CONTEXTS: list = []        # green contexts live to the end (a stream of a destroyed one aborts: sm_partition.py)


def _green_stream(green, **options):
    context = green.create(num_sms=64, device_id=torch.cuda.current_device(), **options)
    _CONTEXTS.append(context)
    return context.Stream()


def codec_streams() -> dict:
    out = {"plain": torch.cuda.Stream()}
    green = getattr(torch.cuda, "GreenContext", None)
    if green is None:
        return out
    try:
        out["green64"] = _green_stream(green)
    except Exception as e:                               # noqa: BLE001 - reported, the others still run
        print(f"  (no green context: {e})")
    if "workqueue_scope" in inspect.signature(green.create).parameters:
        try:
            out["green64-balanced"] = _green_stream(green, workqueue_scope="balanced")
        except Exception as e:                           # noqa: BLE001
            print(f"  (no balanced workqueues: {e})")
    else:
        print(f"  (this PyTorch {torch.__version__} sets no green-context workqueues)")
    return out


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA_DEVICE_MAX_CONNECTIONS="
          f"{os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset (8)')}")
    talkers, codecs = talker_streams(), codec_streams()
    for copies in (False, True):
        print(f"copies {'on' if copies else 'off'} (talker: host-to-device in; codec: device-to-host out)")
        for cname, cstream in codecs.items():
            codec = graph_of(cstream, LONG, 1 << 20, False, copies, own_capture=True)
            alone_b = min(timed(codec, cstream) for _ in range(REPS))
            for tname, tstream in talkers.items():
                talker = graph_of(tstream, SHORT, 1 << 10, copies, False, own_capture=False)
                alone_a = min(timed(talker, tstream) for _ in range(REPS))
                beside, launches = [], []
                for _ in range(REPS):
                    cstream.synchronize()                # (a device synchronise may not cover a green context)
                    tstream.synchronize()
                    codec()                              # the codec call first, as a step that launches one
                    launch, total = launch_and_wait(talker, tstream)
                    beside.append(total)
                    launches.append(launch)
                cstream.synchronize()
                verdict = "waited" if min(beside) > 0.5 * alone_b else "overlapped"
                print(f"  codec {cname:17s} ({alone_b:7.0f} us alone)  talker {tname:13s}: {alone_a:6.0f} us "
                      f"alone, {min(beside):7.0f} / {max(beside):7.0f} us beside (host in the launch: "
                      f"{max(launches):6.0f})  -> {verdict}", flush=True)


if __name__ == "__main__":
    main()
