"""How requests enter an EngineCore (`add_request`, `add_requests`): checked, their prompts built together, queued
with the scheduler. A mixin of EngineCore (engine.py), which owns the state it uses: `config`, `model`, `scheduler`,
`live`, `trace`."""
from __future__ import annotations

import contextlib
import time

from .engine_stream import on_engine_stream
from .errors import QueueFullError
from .live_request import LiveRequest
from .model_api import prepare_requests
from .request import SpeechRequest, check_options
from .sequence import Sequence


def _options_error(request: SpeechRequest) -> ValueError | None:
    """check_options' ValueError for the request, or None."""
    try:
        check_options(request)
    except ValueError as e:
        return e
    return None


class RequestIntake:
    @on_engine_stream
    def add_request(self, request: SpeechRequest) -> None:
        """Validate and queue. Raises ValueError (bad input) or QueueFullError; nothing is queued then."""
        error = self.add_requests([request])[0]
        if error is not None:
            raise error

    @on_engine_stream
    def add_requests(self, requests: list[SpeechRequest]) -> list[Exception | None]:
        """Validate and queue a burst of arrivals, their prompts built together (the model's `prepare_many`: one
        batched pass instead of one build per request, which cost ~0.9 ms of engine-thread time each on an H200
        while the GPU idled). Per request, in order: None (queued) or the error `add_request` raises for it alone,
        ValueError (bad input: options out of range (request.check_options) or refused by the model's prepare; id
        in use) or QueueFullError; a bad request fails alone, the others are queued.

        Each check is made as if the requests came one by one: a request runs into a full queue, or finds its
        id in use, exactly when it would have after the ones before it. So a round of builds takes at most as many
        requests as the queue has room for, and stops before an id repeated in the round."""
        errors: list[Exception | None] = [None] * len(requests)
        i = 0
        while i < len(requests):
            room = self.config.max_waiting - self.scheduler.num_waiting
            round_, ids = [], set()
            while i < len(requests):
                rid = requests[i].request_id
                if rid in ids or (round_ and len(round_) >= room):
                    break               # decided by the outcome of this round: the next round checks it
                if (bad := _options_error(requests[i])) is not None:
                    errors[i] = bad     # out of range: this request only, before any of it reaches a tensor
                elif rid in self.live:
                    errors[i] = ValueError(f"request id {rid!r} is already in use")
                elif len(round_) >= room:
                    errors[i] = QueueFullError(f"the engine queue is full ({self.config.max_waiting} waiting "
                                               "requests)")
                else:
                    round_.append(i)
                    ids.add(rid)
                i += 1
            if round_:
                self._queue_round(requests, round_, errors)
        return errors

    def _queue_round(self, requests: list[SpeechRequest], round_: list[int], errors: list) -> None:
        """Prepare requests[i] for i in round_ together and queue those that can run; their errors into `errors`."""
        t_in = time.monotonic()
        with self.trace.profiling_prepare() if self.trace is not None else contextlib.nullcontext():
            results = prepare_requests(self.model, [requests[i] for i in round_])
        # Every request of the round waited for the whole build: its share of first-audio latency.
        prepare_seconds = time.monotonic() - t_in
        added = 0
        for i, prepared in zip(round_, results):
            if isinstance(prepared, Exception):
                errors[i] = prepared
                continue
            if prepared.prompt_len + prepared.max_frames > self.config.max_model_len:
                errors[i] = ValueError(
                    f"the request may need {prepared.prompt_len + prepared.max_frames} positions (prompt "
                    f"{prepared.prompt_len} + up to {prepared.max_frames} frames) but this engine serves at most "
                    f"{self.config.max_model_len}; shorten the input or lower max_new_tokens")
                continue
            request = requests[i]
            seq = Sequence.from_prepared(prepared)
            live = LiveRequest(request, prepared, seq, time.monotonic())
            live.prepare_seconds = prepare_seconds
            self.live[request.request_id] = live
            self.scheduler.add(seq)
            added += 1
        if self.trace is not None:
            self.trace.note_added(added, prepare_seconds)
