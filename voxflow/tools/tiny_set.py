"""The standard set of tiny checkpoints that tests and golden fixtures share.

tools/oracle/dump_goldens.py runs the official implementation on exactly these checkpoints, and the test
suite regenerates them (bit-identically, from the same seeds) before comparing voxflow against the goldens.
"""
from __future__ import annotations

import os

TINY_SET = {
    "custom_voice": dict(variant="custom_voice"),                      # size tag 0b6: instructions dropped
    "voice_design": dict(variant="voice_design"),
    "base": dict(variant="base"),
    # 1.7B-like CustomVoice (instructions honoured) with talker hidden == code-predictor hidden, so that
    # small_to_mtp_projection is an Identity as in the real 0.6B models.
    "custom_voice_1b7": dict(variant="custom_voice", size_tag="1b7", talker_hidden=64, cp_hidden=64),
}


def write_tiny_set(root: str, names=None) -> dict[str, str]:
    from .tiny_checkpoint import write_tiny_checkpoint
    paths = {}
    for name, kw in TINY_SET.items():
        if names is not None and name not in names:
            continue
        kw = dict(kw)
        paths[name] = write_tiny_checkpoint(os.path.join(root, name), kw.pop("variant"), **kw)
    return paths


def has_tiny_set(root: str | None) -> bool:
    return bool(root) and all(os.path.exists(os.path.join(root, n, "config.json")) for n in TINY_SET)
