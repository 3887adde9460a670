"""cuBLAS GEMMs chosen for fewer SMs than the GPU has, while a CUDA graph is captured: `gemm_sm_target(n, device)`.

Why: the codec runs on its own green context of 64 of an H200's 132 SMs (sm_partition.py), beside the talker's
step. cuBLAS picks a 64-row GEMM's tiles and split-K for all 132 SMs (e.g. 96-128 programs for the talker's and
the code predictor's gate|up), so while the codec holds its SMs such a GEMM runs in two waves on the ~68 left: the
0.6B's c=64 step takes 5.7 ms alone and ~7.4 ms beside the codec (H200 sessions 27-32), 7.7 ms when confined to 68
SMs (session 23). cuBLAS can be told how many SMs to plan for - the cuBLAS API per handle
(`cublasSetSmCountTarget`), cuBLASLt per matmul (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, which PyTorch sets from
`torch._C._set_sm_carveout_experimental`) - and a graph keeps the kernels chosen at its capture. So a step graph
captured under a target of 68 runs one wave of larger tiles beside the codec; the engine replays it for steps
that run while the codec is busy (EngineConfig.talker_gemm_sms). Off until measured on the device.

Both knobs are set (this thread's cuBLAS handle, PyTorch's carveout) and put back on exit. Triton kernels are not
affected: their grids are the callers'. On a CPU the context does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os

import torch

from .sm_partition import GRANULARITY

log = logging.getLogger(__name__)
# VOXFLOW_GEMM_SM_TARGET_LT=1: inside the context PyTorch also prefers cuBLASLt for its GEMMs, whose per-matmul
# descriptor carries the target (the carveout) for certain, in case the cuBLAS API's handle target turns out to be
# ignored on the device. An A/B of the mechanism (probe_gemm_sm_target.py --lt), off by default: it also changes
# which library picks the kernels.
PREFER_LT = os.environ.get("VOXFLOW_GEMM_SM_TARGET_LT", "0") == "1"


def check_target(num_sms: int, total: int) -> None:
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 0 < num_sms <= total:
        raise ValueError(f"a GEMM SM target is a count of 1..{total} SMs, not {num_sms!r}")


_library: ctypes.CDLL | None = None


def _cublas_library() -> ctypes.CDLL | None:
    """The libcublas this process has loaded (the one PyTorch's handles belong to: call after making a handle), found
    in /proc/self/maps; where several are loaded, the one beside torch's own nvidia libraries, or that matches its
    CUDA major version. None where there is none (then only cuBLASLt's per-matmul target is set); not remembered,
    so a later call, once PyTorch has loaded it, finds it."""
    global _library
    if _library is not None:
        return _library
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "libcublas.so" in line and "libcublasLt" not in line})
    except OSError:
        paths = []
    major = (torch.version.cuda or "").split(".")[0]
    torch_dir = os.path.dirname(os.path.dirname(torch.__file__))          # site-packages: nvidia/cublas/lib there
    ranked = sorted(paths, key=lambda p: (not p.startswith(torch_dir), not p.endswith(f".so.{major}")))
    if len(ranked) > 1:
        log.warning("several libcublas loaded (%s): GEMM SM targets through %s", ", ".join(ranked), ranked[0])
    for path in ranked:
        try:
            lib = ctypes.CDLL(path)
            lib.cublasSetSmCountTarget.argtypes = [ctypes.c_void_p, ctypes.c_int]
            lib.cublasGetSmCountTarget.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError):
            continue
        _library = lib
        return lib
    log.warning("no libcublas with cublasSetSmCountTarget in this process: GEMM SM targets reach cuBLASLt only")
    return None


def _handle_target(lib: ctypes.CDLL, handle: int) -> int:
    value = ctypes.c_int(0)
    status = lib.cublasGetSmCountTarget(ctypes.c_void_p(handle), ctypes.byref(value))
    if status != 0:
        raise RuntimeError(f"cublasGetSmCountTarget failed (status {status})")
    return value.value


def _set_handle_target(lib: ctypes.CDLL, handle: int, num_sms: int) -> None:
    status = lib.cublasSetSmCountTarget(ctypes.c_void_p(handle), num_sms)
    if status != 0:
        raise RuntimeError(f"cublasSetSmCountTarget({num_sms}) failed (status {status})")


@contextlib.contextmanager
def gemm_sm_target(num_sms: int | None, device: torch.device):
    """Within it, cuBLAS GEMMs issued by this thread on CUDA `device` are planned for `num_sms` SMs (None, or a CPU
    device: no change)."""
    if num_sms is None or torch.device(device).type != "cuda":
        yield
        return
    total = torch.cuda.get_device_properties(device).multi_processor_count
    check_target(num_sms, total)
    with torch.cuda.device(device):
        handle = torch.cuda.current_blas_handle()          # (first: it loads libcublas if nothing has yet)
    lib = _cublas_library()
    saved_handle = _handle_target(lib, handle) if lib is not None else None
    saved_carveout = torch._C._get_sm_carveout_experimental()
    saved_library = torch.backends.cuda.preferred_blas_library() if PREFER_LT else None
    torch._C._set_sm_carveout_experimental(total - num_sms)
    try:
        if PREFER_LT:
            torch.backends.cuda.preferred_blas_library("cublaslt")
        if lib is not None:
            _set_handle_target(lib, handle, num_sms)
        yield
    finally:
        torch._C._set_sm_carveout_experimental(saved_carveout)
        if saved_library is not None:
            torch.backends.cuda.preferred_blas_library(saved_library)
        if lib is not None:
            _set_handle_target(lib, handle, saved_handle)

STEP_CHOICES = ("busy", "all")


def busy_gemm_sms(setting: int | str | None, device: torch.device, codec_sms: int | None) -> int | None:
    """EngineConfig.talker_gemm_sms -> the SM target of the talker's busy-step graphs (None: no such graphs).
    "rest" is the GPU's SMs less the codec's partition (`codec_sms`, None for the whole GPU: then there is no rest
    to plan for, an error). A bad setting is an error on a CPU too; there it then does nothing."""
    if setting is None:
        return None
    if setting != "rest" and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 1):
        raise ValueError(f'talker_gemm_sms is None, "rest" or a number of SMs >= 1, not {setting!r}')
    device = torch.device(device)
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).multi_processor_count
    if setting == "rest":
        if codec_sms is None:
            raise ValueError('talker_gemm_sms="rest" needs the codec on an SM partition (codec_sms), and the codec '
                             "runs on the whole GPU here")
        # what the driver gives: a partition rounded up to whole steps (60 asked run on 64)
        setting = total - -(-codec_sms // GRANULARITY) * GRANULARITY
    check_target(setting, total)
    return setting
