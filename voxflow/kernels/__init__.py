"""Triton kernels, each beside the plain PyTorch reference it must match (tests hold them together).

The layers call a kernel only when `use_kernels(tensor)` says so: the switch is on (default; turned off by
`set_kernels_enabled(False)` or VOXFLOW_KERNELS=0, e.g. for the stacked comparison in `voxflow bench`), Triton
imports, and the tensor lives on a CUDA device. Everything else (CPU, CI) runs the reference. Tests may run a
kernel on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1) by calling it directly.

Programmatic dependent launch (`use_pdl`, pdl.py): on by default on Hopper or newer (H200: c=1 RTF 0.054 ->
0.052); VOXFLOW_PDL=0 (or `set_pdl_enabled(False)`) turns it off.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

_enabled = os.environ.get("VOXFLOW_KERNELS", "1") not in ("0", "false", "off")
_pdl = os.environ.get("VOXFLOW_PDL", "1") not in ("0", "false", "off")


@functools.lru_cache(maxsize=None)
def _triton_available() -> bool:
    """Imported on the first question, not with this package: a process that never runs a kernel (the CPU voice's
    engine, the API process) never loads Triton (whose bindings print leak reports at interpreter exit)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def env_int(name: str, default: int | None, *, power_of_two: bool = False) -> int | None:
    """A kernel's launch setting from the environment (A/B runs): the integer VOXFLOW_... holds, else `default`;
    a value under 1 (or not a power of two, when asked) is refused at import, not at the first launch."""
    raw = os.environ.get(name)
    if not raw:
        return default
    value = int(raw)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if power_of_two and value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value


# The fp8 format of KV pages (EngineConfig.kv_cache_dtype = "fp8"): e4m3, finite-only (Triton's fp8e4nv).
FP8_KV = torch.float8_e4m3fn


def as_stored(t: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor (an fp8 KV pool) seen as its bytes, for gathers and scatters that only move data: indexing
    kernels take uint8 everywhere, fp8 not on every device; any other tensor as it is."""
    return t.view(torch.uint8) if t.dtype == FP8_KV else t


def fp8_kernels_supported(device: torch.device) -> bool:
    """Whether Triton's e4m3 type (fp8e4nv: fp8 KV pages) compiles for this CUDA device: compute capability >= 8.9,
    NVIDIA only (Triton refuses it for sm_80 and for many ROCm targets)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def set_kernels_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def kernels_enabled() -> bool:
    return _enabled and _triton_available()


@contextlib.contextmanager
def kernels_off():
    """The plain PyTorch path for what runs inside (a reference pass next to the kernels' own, e.g. the codec's
    precision check at load); the switch as it was after. Process-wide, as the switch: for single-threaded setup
    code, never around serving."""
    global _enabled
    saved = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = saved


def use_kernels(t: torch.Tensor) -> bool:
    """True when the fused kernels should run for tensors like `t` (on a CUDA device, switch on)."""
    return t.is_cuda and kernels_enabled()


def set_pdl_enabled(on: bool) -> None:
    global _pdl
    _pdl = bool(on)


def pdl_enabled() -> bool:
    return _pdl


def use_pdl(t: torch.Tensor) -> bool:
    """True when kernels on tensors like `t` should launch with programmatic dependent launch (pdl.py): switch on,
    kernels on, an NVIDIA device (not ROCm) of compute capability >= 9 (the griddepcontrol instructions are
    Hopper's), CUDA >= 12.3 (graphs keep programmatic launches from there on) and a Triton that has them
    (`gdc_wait`, the `launch_pdl` option: Triton 3.4 on); anything older runs the kernels without PDL."""
    return (_pdl and use_kernels(t) and _pdl_toolchain() and _major_capability(t.device.index) >= 9)


@functools.lru_cache(maxsize=None)
def _pdl_toolchain() -> bool:
    cuda = torch.version.cuda
    if cuda is None or tuple(int(v) for v in cuda.split(".")[:2]) < (12, 3):
        return False
    try:
        import triton.language as tl
        return hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
    except (ImportError, AttributeError):
        return False


def sm_count(device: torch.device) -> int | None:
    """The streaming multiprocessors of a CUDA device (launch configs sized to one wave of programs); None for any
    other device (the CPU, where Triton's interpreter runs the kernels)."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _major_capability(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]
