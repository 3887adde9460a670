"""`KEY=VALUE` strings (the `--engine-arg` option of `voxflow serve` and `voxflow bench`) -> EngineConfig fields,
typed from the dataclass's annotations."""
from __future__ import annotations

import dataclasses
import typing


def parse_engine_args(items: list[str] | None) -> dict:
    """`--engine-arg key=value` (repeatable) -> EngineConfig fields, typed from the dataclass."""
    from voxflow.engine.config import EngineConfig
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    hints = typing.get_type_hints(EngineConfig)
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ValueError(f"--engine-arg {item!r}: expected key=value with key one of "
                             f"{', '.join(sorted(fields))}")
        out[key] = _convert(raw.strip(), hints.get(key), item)
    return out


def _convert(raw: str, hint, item: str):
    if raw.lower() in ("none", "null"):
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    for t in args:
        try:
            if t is bool:
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off"):
                    return False
                continue
            if t in (int, float, str):
                return t(raw)
        except (TypeError, ValueError):
            continue
    raise ValueError(f"--engine-arg {item!r}: cannot read {raw!r} as {hint}")
