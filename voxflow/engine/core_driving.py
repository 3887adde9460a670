"""What drives an engine core (the in-process driver, the offline runner, the offline bench) needs of any core, be
it an EngineCore or a OneShotCore: how a burst of requests goes in, how its refusals are told apart, and where the
outputs that are ready before a step ends go."""
from __future__ import annotations

import contextlib
from typing import Callable

from .errors import QueueFullError
from .request import SpeechRequest


def refusal_kind(error: Exception) -> str:
    """The error kind of a request `add_to_core` refused: "overloaded" (QueueFullError: back-pressure, not a failure
    of the engine) or "invalid_request" (ValueError: bad input, this request only). Anything else is an engine bug
    and is raised."""
    if isinstance(error, QueueFullError):
        return "overloaded"
    if isinstance(error, ValueError):
        return "invalid_request"
    raise error


def add_to_core(core, requests: list[SpeechRequest]) -> list[Exception | None]:
    """A burst of requests into any core: `EngineCore.add_requests` (their prompts built in one batched pass) when
    it has it, else `add_request` one by one (e.g. OneShotCore). Per request None (queued) or the ValueError /
    QueueFullError it was refused with; anything else propagates."""
    add_requests = getattr(core, "add_requests", None)
    if add_requests is not None:
        return add_requests(requests)
    errors: list[Exception | None] = []
    for request in requests:
        try:
            core.add_request(request)
            errors.append(None)
        except (ValueError, QueueFullError) as e:
            errors.append(e)
    return errors


@contextlib.contextmanager
def early_outputs(core, take: Callable[[list], None]):
    """While the block runs, the outputs `core` has ready before a step ends (EngineConfig.emit_while_waiting) go
    to `take` at once, as the step's own outputs do after it (a core without `emit_early`: nothing to do)."""
    with _lent(core, "emit_early", take):
        yield


@contextlib.contextmanager
def arrivals_while_waiting(core, take: Callable[[], None]):
    """While the block runs, `core` may call `take` once a step while it waits for the GPU, to take in the requests
    that arrived meanwhile (EngineConfig.intake_while_waiting; a core without `take_arrivals`: nothing to do)."""
    with _lent(core, "take_arrivals", take):
        yield


@contextlib.contextmanager
def _lent(core, hook: str, fn: Callable):
    """`core.<hook>` set to `fn` for the block, put back after it (a core without the hook is left alone)."""
    if not hasattr(core, hook):
        yield
        return
    before = getattr(core, hook)
    setattr(core, hook, fn)
    try:
        yield
    finally:
        setattr(core, hook, before)
