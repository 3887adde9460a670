"""The whole codec call (random real-size weights, fp16, on SMS SMs) under switch settings, in alternating rounds.

    PYTHONPATH=$PWD python benchmarks/scripts/ab_codec_call.py [--streams 16] [--sms 64] [--rounds 2] \
        VARIANT [VARIANT ...]

A VARIANT is LABEL or LABEL:module.ATTR=VALUE[,module.ATTR=VALUE...] (modules under voxflow., VALUE a Python literal),
e.g. `base` `flat:kernels.causal_conv.CONV_TMA_FLAT=True`; module.ATTR[KEY]=VALUE sets one entry of a dict attribute
(restored after), e.g. `k64:kernels.residual_unit_tma.CONFIGS[96]={'BLOCK_T': 128, ...}`. Each round builds a fresh
runner per variant (its CUDA graphs captured under that variant's settings, the others' restored) and times 1-, 5-
and 25-frame calls (profile_codec.time_calls). Same-machine comparisons only; the rounds show the spread.
"""
import argparse
import ast
import importlib
import re
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_codec import time_calls  # noqa: E402


# a setting starts at a comma followed by module.ATTR= or module.ATTR[KEY]= (a dict VALUE's own commas are not)
_SETTING_START = re.compile(r",(?=[A-Za-z_][\w.]*(\[[^\]]*\])?=)")
_SETTING = re.compile(r"([\w.]+)\.(\w+)(?:\[(.*)\])?=(.*)", re.S)


def parse(variant: str) -> tuple[str, list]:
    """-> (label, [(module, attr, key or None, value)])"""
    label, _, spec = variant.partition(":")
    settings = []
    for item in filter(None, _SETTING_START.split(spec)[::2]):
        m = _SETTING.fullmatch(item)
        if m is None:
            raise SystemExit(f"not module.ATTR=VALUE or module.ATTR[KEY]=VALUE: {item!r}")
        module, attr, key, value = m.groups()
        settings.append((importlib.import_module(f"voxflow.{module}"), attr,
                         None if key is None else ast.literal_eval(key), ast.literal_eval(value)))
    return label, settings


def _apply(settings: list) -> list:
    """Set each setting; -> what restores them (the same form, the old values)."""
    saved = []
    for m, a, k, v in settings:
        target = getattr(m, a)
        if k is None:
            saved.append((m, a, None, target))
            setattr(m, a, v)
        else:
            saved.append((m, a, k, target[k]))
            target[k] = v
    return saved[::-1]


def run(label: str, settings: list, streams: int, sms: int) -> None:
    from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
    from voxflow.tools.codec_snr import random_real_codec_decoder
    saved = _apply(settings)
    try:
        runner = Qwen3CodecRunner.from_decoder(random_real_codec_decoder("cuda").half(), max_rows=streams,
                                               stream_sms=sms)
        states = [runner.new_state(None) for _ in range(streams)]
        for n in (1, 5, 25):
            frames = [torch.randint(0, 2048, (n, 16), device="cuda") for _ in range(streams)]
            time_calls(runner, states, frames, f"codec fp16 B={streams} n={n} {label}", warm=2, reps=5)
        del runner, states
        torch.cuda.empty_cache()
    finally:
        _apply(saved)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--sms", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args()
    variants = [parse(v) for v in args.variants]
    for r in range(args.rounds):
        print(f"round {r + 1}", flush=True)
        for label, settings in variants:
            try:
                run(label, settings, args.streams, args.sms)
            except Exception as e:          # (one variant's failure - e.g. a tile TMA refuses - keeps the others)
                print(f"codec {label}: Error {type(e).__name__}: {str(e)[:300]}", flush=True)
                torch.cuda.empty_cache()
