"""Errors every engine core raises alike (the batched engine and the one-shot CPU voice), in a module of their own
so that a core imports them without the batched engine's modules (and with those, Triton)."""
from __future__ import annotations


class QueueFullError(RuntimeError):
    """The engine's queue is full: retry later (HTTP 429/503)."""
