"""Strict loading of safetensors weights into modules, by their real checkpoint key names.

Every voxflow module of Qwen3-TTS has state-dict keys equal to the checkpoint keys with the component's
prefix removed (`talker.`, `speaker_encoder.`, `encoder.`, `decoder.`), so loading is a key-for-key copy
that fails loudly on a missing, unexpected or mis-shaped key instead of leaving random weights behind.
"""
from __future__ import annotations

import torch
from safetensors import safe_open
from torch import nn


class WeightLoadError(ValueError):
    """The checkpoint's tensors do not match the model built from its config."""


def read_safetensors(path: str, prefix: str | None = None) -> dict[str, torch.Tensor]:
    """All tensors of a file (optionally only those under `prefix`, with the prefix kept)."""
    out = {}
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            if prefix is None or key.startswith(prefix):
                out[key] = f.get_tensor(key)
    return out


def split_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix`, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def check_keys(module: nn.Module, shapes: dict[str, tuple], *, what: str, prefix: str = "",
               ignore_unexpected: tuple[str, ...] = ()) -> None:
    """Raise WeightLoadError unless `shapes` (checkpoint key without `prefix` -> shape) has exactly the
    module's state-dict keys with the same shapes. Works for modules on the meta device."""
    expected = module.state_dict(keep_vars=True)
    missing = sorted(k for k in expected if k not in shapes)
    unexpected = sorted(k for k in shapes if k not in expected and not k.startswith(ignore_unexpected))
    misshaped = sorted(f"{prefix}{k}: checkpoint {tuple(shapes[k])} vs model {tuple(v.shape)}"
                       for k, v in expected.items() if k in shapes and tuple(shapes[k]) != tuple(v.shape))
    problems = []
    for label, items, sep in (("missing", [prefix + k for k in missing], ", "),
                              ("unexpected", [prefix + k for k in unexpected], ", "),
                              ("mis-shaped", misshaped, "; ")):
        if items:
            problems.append(f"{len(items)} {label} key(s): " + sep.join(items[:8]) + (" ..." if len(items) > 8 else ""))
    if problems:
        raise WeightLoadError(f"{what}: checkpoint does not match the model: " + " | ".join(problems))


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], *, what: str, prefix: str = "",
              ignore_unexpected: tuple[str, ...] = ()) -> None:
    """Copy `tensors` (keys without `prefix`) into `module`, checking names and shapes both ways.

    Values are cast to each parameter's dtype and moved to its device, so the caller picks dtype and device
    by building the module first. They are copied into the module's own tensors, so loading allocates nothing
    that stays: a second copy of the weights would leave the first one's blocks cached but unused on a GPU. A
    module on the meta device is materialised on the CPU, and a tensor that two names share gets its own copy
    for the second name (each name keeps its checkpoint value).
    `ignore_unexpected`: key prefixes that real checkpoints carry but inference never reads.
    """
    check_keys(module, {k: tuple(v.shape) for k, v in tensors.items()}, what=what, prefix=prefix,
               ignore_unexpected=ignore_unexpected)
    seen: set[tuple] = set()               # tensors already written: one shared by two names is seen again
    with torch.no_grad():
        for name, target in module.state_dict(keep_vars=True).items():
            key = (target.data_ptr(), tuple(target.shape), target.stride())
            if target.device.type != "meta" and (target.numel() == 0 or key not in seen):
                seen.add(key)
                target.copy_(tensors[name])
                target.requires_grad_(False)          # as a loaded Parameter always was (inference only)
                continue
            device = torch.device("cpu") if target.device.type == "meta" else target.device
            _assign(module, name, tensors[name].to(device=device, dtype=target.dtype))


def _assign(module: nn.Module, name: str, value: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    owner = module
    for p in path:
        owner = getattr(owner, p)
    old = owner._parameters.get(leaf) if leaf in owner._parameters else None
    if old is not None:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value
