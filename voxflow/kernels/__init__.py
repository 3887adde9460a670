"""Triton kernels, each beside the plain PyTorch reference it must match (tests hold them together).

The layers call a kernel only when `use_kernels(tensor)` says so: the switch is on (default; turned off by
`set_kernels_enabled(False)` or VOXFLOW_KERNELS=0, e.g. for the stacked comparison in `voxflow bench`), Triton
imports, and the tensor lives on a CUDA device. Everything else (CPU, CI) runs the reference. Tests may run a
kernel on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1) by calling it directly.
"""
from __future__ import annotations

import os

import torch

_enabled = os.environ.get("VOXFLOW_KERNELS", "1") not in ("0", "false", "off")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


TRITON_AVAILABLE = _triton_available()


def set_kernels_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def kernels_enabled() -> bool:
    return _enabled and TRITON_AVAILABLE


def use_kernels(t: torch.Tensor) -> bool:
    """True when the fused kernels should run for tensors like `t` (on a CUDA device, switch on)."""
    return t.is_cuda and kernels_enabled()
