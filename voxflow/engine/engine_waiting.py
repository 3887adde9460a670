"""What an EngineCore's host does while the GPU runs the decode in flight (it waits for that decode's flags in every
step, ~5 ms at 0.6B c=64): take the requests that arrived meanwhile (EngineConfig.intake_while_waiting) and send
the chunks that land (EngineConfig.emit_while_waiting). A mixin of EngineCore (engine.py), which owns the state it
uses: `config`, `take_arrivals` / `emit_early` (set by the driver for one step), `codec_exec`, and this step's
counters `_intake_seconds`, `_early_seconds`, `_early_chunks`, `_early_finals`."""
from __future__ import annotations

import time

from .engine_outputs import Output
from .request import AudioChunk, FinalRecord

# emit_while_waiting: how long the host sleeps between two polls of the codec while the decode in flight runs (a
# poll that finds nothing costs a few microseconds; a sleep overshoots by the OS's timer slack, ~50 us on Linux)
EMIT_POLL_S = 1e-4


class WhileWaiting:
    def _take_arrivals_while_waiting(self, event) -> BaseException | None:
        """EngineConfig.intake_while_waiting: while the decode in flight still runs on the GPU, the driver's
        `take_arrivals` adds the requests that arrived during this step (their prompts built now, on the host time
        this wait would idle away; scheduled in the next step, as if taken after this one). Once a step, only when the
        GPU is busy: the wave of arrivals a closed loop of clients sends built its prompts between steps, ~4-8 ms of
        host time in which the GPU ran dry (session 61's 0.6B c=64 step traces). An error it raises is returned,
        for the step to raise once it is whole."""
        if not (self.config.intake_while_waiting and self.take_arrivals is not None and event is not None
                and not event.query()):
            return None
        started = time.perf_counter()
        try:
            self.take_arrivals()
        except BaseException as e:          # noqa: BLE001 - raised by the step once it is whole
            return e
        finally:
            self._intake_seconds = time.perf_counter() - started
        return None

    def _emit_while_waiting(self, event) -> BaseException | None:
        """Until `event` (the decode in flight) completes, while codec calls are in flight: the chunks that land, and
        the final records of the requests they complete, go out through `emit_early` at once rather than at the end
        of this step, after the wait; each batch in the order the step's end would have given it. Polled every
        EMIT_POLL_S. An emit_early that raises ends the polling: its error is returned, for the step to raise once
        it is whole (its batch is lost, as a step's outputs are when their delivery fails)."""
        while self.codec_exec.busy and not event.query():
            outputs: list[Output] = []
            self._emit_chunks(outputs)
            self._retire_drained(outputs)
            if not outputs:
                time.sleep(EMIT_POLL_S)
                continue
            self._early_chunks += sum(isinstance(o, AudioChunk) for o in outputs)
            self._early_finals += sum(isinstance(o, FinalRecord) for o in outputs)
            started = time.perf_counter()
            try:
                self.emit_early(outputs)
            except BaseException as e:          # noqa: BLE001 - raised by the step once it is whole
                return e
            finally:
                self._early_seconds += time.perf_counter() - started
        return None
