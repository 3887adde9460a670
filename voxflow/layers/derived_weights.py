"""Tensors derived from a module's weights (packed, fused, folded copies), kept on the module and made again when a
weight they come from is replaced or changed in place."""
from __future__ import annotations

import torch
from torch import nn


def per_weight_version(owner: nn.Module, params: tuple[torch.Tensor, ...], make, tag: str = "",
                       none_in_capture: bool = False):
    """`make()` (a tensor or tuple of tensors derived from `params`), kept on `owner._derived` and made again only
    when a parameter is replaced or changed in place (its data pointer, version counter, dtype or device moved).
    Never kept when made inside a CUDA-graph capture: that memory belongs to the graph's pool; with
    `none_in_capture`, not even made there (None: the caller takes its path without it). `tag` tells apart two
    derivations of the same parameters on one owner (one slot: the other is made again, never served)."""
    key = (tag,) + tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
    cached = owner._derived
    if cached is not None and cached[0] == key:
        return cached[1]
    capturing = params[0].is_cuda and torch.cuda.is_current_stream_capturing()
    if capturing and none_in_capture:
        return None
    value = make()
    if not capturing:
        owner._derived = (key, value)
    return value


def drop_derived_weights(module: nn.Module) -> None:
    """Forget every tensor `per_weight_version` keeps under `module` (its submodules' `_derived`), freeing their
    memory; each is made again on its next use."""
    for m in module.modules():
        if getattr(m, "_derived", None) is not None:
            m._derived = None
