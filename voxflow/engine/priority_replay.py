"""Replay the talker's CUDA graphs on a high-priority stream.

The codec decodes on its own stream beside the talker (codec_runner.py); its kernels are large (whole-GPU
convolutions and GEMMs of a few ms at high batch) while a talker step is a chain of ~1,000 small ones. At equal
priority a small kernel queues behind the codec's blocks for free SMs at every link of the chain, so the overlap
the two streams were meant to give turns into the sum of both. The GPU's block scheduler hands free SMs to the
pending blocks of the higher-priority stream first (running blocks are never preempted), so the per-frame step
keeps its pace and the codec fills the gaps.

Measured (H200, 1.7B, c=64, benchmarks/results/h200/2026-12-01-session5/profile_{prio,noprio}.txt): no gain, 9.52
vs 9.34 ms a step, the host 0.8 ms slower launching; the codec's running blocks hold the SMs long enough that
dispatch order does not matter. So it is off by default (EngineConfig.talker_priority), kept for other GPUs/loads.

A graph launched into a stream runs at that stream's priority. The replay stream first waits for the caller's
current stream (inputs copied there) and the caller's stream then waits for the replay (outputs read there), so
callers see the same ordering as a replay on their own stream.
"""
from __future__ import annotations

import torch

HIGHEST = -100          # PyTorch clamps to the device's highest priority


class GraphReplayer:
    def __init__(self, device: torch.device, high_priority: bool):
        device = torch.device(device)
        self.stream = (torch.cuda.Stream(device, priority=HIGHEST)
                       if high_priority and device.type == "cuda" else None)

    def replay(self, graph: "torch.cuda.CUDAGraph") -> None:
        if self.stream is None:
            graph.replay()
            return
        caller = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            graph.replay()
        caller.wait_stream(self.stream)
