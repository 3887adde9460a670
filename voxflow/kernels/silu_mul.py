"""silu(gate) * up in one Triton kernel: the element-wise middle of the SwiGLU MLP.

The reference `F.silu(gate) * up` is two kernels and a round trip of the [tokens, intermediate] activation
through memory. The kernel keeps the reference rounding: silu in fp32 (x / (1 + exp(-x)), the expression
torch's CUDA kernel uses, with the same libdevice `expf` and an IEEE division), rounded to the activation dtype,
then the product rounded again.

On CUDA the result is bit-identical to torch's (measured on an H200, 4M elements each in fp32 and bf16; the GPU
test asserts equality). Under the CPU interpreter `exp` is numpy's and torch's CPU silu has its own formula, so
the CPU test allows 8 ulp in fp32 and 1 in bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voxflow.kernels.rms_norm import MAX_ROW_FACTOR_WIDTH, round_to, row_factor

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, width, stride_g, stride_u, PRECISE_EXP: tl.constexpr,
                     BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Rows of `width` elements with their own row strides: gate and up may be the two halves of one fused
    # gate|up projection output (no copy to make them contiguous).
    row, col = offs // width, offs % width
    dtype = gate_ptr.dtype.element_ty
    g = tl.load(gate_ptr + row * stride_g + col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + col, mask=mask, other=0.0).to(tl.float32)
    if PRECISE_EXP:
        e = libdevice.exp(-g)     # expf, as torch's kernel; tl.exp is the faster ex2.approx
    else:
        e = tl.exp(-g)            # the interpreter has no libdevice
    silu = round_to(tl.div_rn(g, 1.0 + e), dtype)
    tl.store(out_ptr + offs, round_to(silu * u, dtype).to(dtype), mask=mask)


def supported(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Same shape, dtype and device (no broadcasting or promotion) and no autograd graph to record."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device or gate.dtype not in _DTYPES:
        return False
    return not (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[rows, width] with a unit last stride: a view when the layout allows (e.g. a half of a fused output)."""
    r = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    return r if r.stride(-1) == 1 else r.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, element-wise; result is contiguous with gate's shape."""
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n:
        g, u = _rows(gate), _rows(up)
        _silu_mul_kernel[(triton.cdiv(n, _BLOCK),)](
            g, u, out, n, gate.shape[-1], g.stride(0), u.stride(0), PRECISE_EXP=gate.is_cuda, BLOCK=_BLOCK,
            num_warps=4, enable_fp_fusion=False)   # keep silu * up a rounded product, never folded into anything
    return out


@triton.jit
def _silu_mul_folded_kernel(gate_ptr, up_ptr, x_ptr, out_ptr, width, hidden, inv_h, eps, stride_g, stride_u,
                            stride_x, stride_o, PRECISE_EXP: tl.constexpr, BLOCK: tl.constexpr,
                            BLOCK_X: tl.constexpr):
    # One program per (row, BLOCK columns): the row's RMSNorm factor from its MLP input x (fp32 statistics, as the
    # reference norm), then gate and up scaled by it and rounded as the GEMM outputs they stand for, then silu * up
    # with the rounding of the plain kernel above.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    r = row_factor(x_ptr + row * stride_x, hidden, inv_h, eps, BLOCK_X)
    dtype = gate_ptr.dtype.element_ty
    g = round_to(tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32) * r, dtype)
    u = round_to(tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32) * r, dtype)
    if PRECISE_EXP:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = round_to(tl.div_rn(g, 1.0 + e), dtype)
    tl.store(out_ptr + row * stride_o + cols, round_to(silu * u, dtype).to(dtype), mask=mask)


def supported_folded(gate: torch.Tensor, up: torch.Tensor, x: torch.Tensor) -> bool:
    """gate / up [rows, I] (unit last strides: e.g. the halves of one gate|up output), x [rows, H] with a unit last
    stride and H <= rms_norm.py's MAX_ROW_FACTOR_WIDTH, one dtype and device."""
    return (gate.dim() == 2 and supported(gate, up) and gate.stride(-1) == 1 and up.stride(-1) == 1
            and x.dim() == 2 and x.shape[0] == gate.shape[0] and x.dtype == gate.dtype and x.device == gate.device
            and x.stride(-1) == 1 and 1 <= x.shape[1] <= MAX_ROW_FACTOR_WIDTH)


def silu_mul_folded(gate: torch.Tensor, up: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """silu(g) * u with g, u = gate, up scaled by the row factor rsqrt(mean(x^2) + eps) and rounded to gate's dtype:
    the MLP middle when the post-attention RMSNorm (of x, the MLP input) was folded into the gate|up weight
    (voxflow/layers/folded_norms.py holds the torch reference). Rows [rows, I], contiguous."""
    if not supported_folded(gate, up, x):
        raise ValueError(f"silu_mul_folded: gate {tuple(gate.shape)}, up {tuple(up.shape)}, x {tuple(x.shape)}")
    rows, width = gate.shape
    out = torch.empty(rows, width, dtype=gate.dtype, device=gate.device)
    if rows and width:
        _silu_mul_folded_kernel[(rows, triton.cdiv(width, _BLOCK))](
            gate, up, x, out, width, x.shape[1], 1.0 / x.shape[1], float(eps), gate.stride(0), up.stride(0),
            x.stride(0), out.stride(0), PRECISE_EXP=gate.is_cuda, BLOCK=_BLOCK,
            BLOCK_X=triton.next_power_of_2(x.shape[1]), num_warps=4, enable_fp_fusion=False)
    return out
