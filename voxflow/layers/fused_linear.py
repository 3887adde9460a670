"""Several bias-free Linear layers that read the same input, as ONE weight (one GEMM launch instead of several).

`fuse_weights(linears)` concatenates their weights once and makes each Linear's weight a VIEW of its rows: no
extra memory, the state dict keeps its names, and loading into a Linear writes the fused weight. The layers fuse at
construction, before the weights are loaded into the views (a fusion after the load leaves the replaced weights'
memory cached but unused on a GPU; a cast goes through `cast_fused_groups`, which keeps them fused, while
`Module.to` splits the views and the next use fuses again). The fused weight is read on the GPU path only (q|k|v
of attention, gate|up of the MLP); the outputs are column slices of the one GEMM's output. The per-element dot
products are the same, but a wider GEMM may pick another cuBLAS kernel, so results can differ in the last bits
from separate GEMMs (held to tolerances in tests/gpu).
"""
from __future__ import annotations

import torch
from torch import nn


def fuse_weights(linears: list[nn.Linear]) -> torch.Tensor | None:
    """The fused [sum of out_features, in_features] weight (None while a CUDA graph is being captured: never
    allocate there)."""
    w0 = linears[0].weight
    if w0.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    fused = torch.cat([lin.weight.detach() for lin in linears])
    _point_views(fused, linears)
    return fused


def _point_views(fused: torch.Tensor, linears: list[nn.Linear]) -> None:
    at = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = fused[at:at + n]
        at += n


def cast_fused_groups(module: nn.Module, dtype: torch.dtype) -> set[int]:
    """Every still-fused group under `module` (a submodule's `fused_groups()`: attribute name -> its Linears) cast
    to `dtype` as one tensor, its Linears' weights views of the cast copy again; returns the ids of the parameters
    cast here. (Cast one by one, the views became separate tensors and the old fused weight stayed alive beside
    them until a later use fused them again.)"""
    done: set[int] = set()
    for m in module.modules():
        for attr, linears in getattr(m, "fused_groups", dict)().items():
            fused = getattr(m, attr)
            if still_fused(fused, linears) and fused.dtype != dtype:
                cast = fused.to(dtype)
                setattr(m, attr, cast)
                _point_views(cast, linears)
                done.update(id(lin.weight) for lin in linears)
    return done


def kept_fused(fused: torch.Tensor | None, linears: list[nn.Linear]) -> torch.Tensor | None:
    """`fused` while the Linears' weights are still its views, else their weights fused again (None while a CUDA
    graph is being captured): what a layer's GPU path reads each call, the caller keeping the result."""
    return fused if still_fused(fused, linears) else fuse_weights(linears)


def still_fused(fused: torch.Tensor | None, linears: list[nn.Linear]) -> bool:
    """True while every Linear's weight is still the view made by `fuse_weights` (not replaced since)."""
    if fused is None:
        return False
    at = 0
    for lin in linears:
        w = lin.weight
        if w.data_ptr() != fused.data_ptr() + at * fused.stride(0) * fused.element_size() or w.dtype != fused.dtype:
            return False
        at += w.shape[0]
    return True
