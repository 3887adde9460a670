"""A step's prefill on a CUDA stream of its own, beside the step's decode (EngineConfig.prefill_stream).

Why: a step that prefills new prompts runs them on the talker's stream before its decode, so every running stream
waits for them: a closed-loop 0.6B c=64 run spent ~5% of its span in the extra time of its ~70 prefill steps
(~1,400 prompt positions each, ~10 ms against ~5.3 for a full decode step alone; session 63's step traces, H100).
The prefill's GEMMs are compute-bound where the decode's small kernels are latency-bound, so side by side they may
take less than one after the other. Off until measured: the codec's calls beside the talker slow its kernels ~38%
(session 61), and what the prefill's do to it is not known.

The order kept (T: the talker's stream, the engine's current one; P: this lane's):
- each step first makes T wait for the prefill queued on P in the step before (`before_step`): the requests it
  prefilled decode in this step (a request decodes from the step after its last prefill chunk), and nothing T
  queues from then on (this step's slot attaches, which may grow the slot buffers; its decode) races with it;
- a step's prefill goes on P behind everything queued on T so far (`running`): the decode before, the slot
  attaches of this step, a slot's snapshot as it was given back, so that KV pages and slots that changed hands
  are done with before P writes them;
- the step's own decode on T does not wait for it: the two run side by side on rows, KV pages and slots of
  different requests.
Tensors made on T that P reads (the prompts' input rows) are marked as used on P (`record_stream`): the caching
allocator then keeps their memory until P is past them, even if their request is aborted meanwhile.
"""
from __future__ import annotations

import contextlib

import torch


class PrefillLane:
    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device)
        self._done: torch.cuda.Event | None = None      # recorded on P after the last prefill queued there

    def before_step(self) -> None:
        """The current (talker) stream waits for the prefill queued in the step before, once."""
        if self._done is not None:
            torch.cuda.current_stream(self.stream.device).wait_event(self._done)
            self._done = None

    @contextlib.contextmanager
    def running(self, inputs: list[torch.Tensor]):
        """The work queued inside goes on P, behind everything queued on the current stream so far; `inputs` (made
        on that stream) are marked as read on P."""
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        for t in inputs:
            if t.is_cuda:
                t.record_stream(self.stream)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            # (also after a failed prefill: the next step's decode waits for whatever it queued)
            self._done = torch.cuda.Event()
            self._done.record(self.stream)


def make_prefill_lane(config, device: torch.device) -> PrefillLane | None:
    """The lane EngineConfig asks for: on a CUDA device only (a CPU runs everything in order anyway); asked for
    together with decode_before_prefill, an error on any device."""
    if not config.prefill_stream:
        return None
    if config.decode_before_prefill:
        raise ValueError("prefill_stream and decode_before_prefill exclude each other: with the decode queued "
                         "first, the prefill's stream would wait for it")
    return PrefillLane(device) if device.type == "cuda" else None
