"""Fused q|k|v and gate|up weights (the GPU path): views without extra memory, same outputs, detected when stale;
silu*mul reading the two halves of one fused output (Triton interpreter, in a subprocess)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

from voxflow.layers.fused_linear import fuse_weights, still_fused

CHILD_FLAG = "VOXFLOW_FUSED_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def test_fused_weight_views_and_outputs():
    torch.manual_seed(0)
    lins = [nn.Linear(32, n, bias=False) for n in (48, 16, 16)]
    x = torch.randn(3, 5, 32)
    separate = [lin(x) for lin in lins]
    fused = fuse_weights(lins)
    assert fused.shape == (80, 32) and still_fused(fused, lins)
    assert all(lin.weight.data_ptr() >= fused.data_ptr() for lin in lins)          # views: no copy kept
    out = torch.nn.functional.linear(x, fused)
    for got, want in zip((out[..., :48], out[..., 48:64], out[..., 64:]), separate):
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
    with torch.no_grad():
        lins[1].weight.copy_(torch.ones(16, 32))                                     # loading writes the fused one
    assert torch.equal(fused[48:64], torch.ones(16, 32)) and still_fused(fused, lins)
    lins[2].weight.data = torch.zeros(16, 32)                                        # replaced: no longer fused
    assert not still_fused(fused, lins) and not still_fused(None, lins)


def check_silu_mul_on_fused_halves():
    from voxflow.kernels.silu_mul import silu_mul
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        gate_up = (torch.randn(2, 3, 2 * 40, generator=g) * 3).to(dtype)
        gate, up = gate_up[..., :40], gate_up[..., 40:]
        got = silu_mul(gate, up)
        assert got.is_contiguous() and got.shape == (2, 3, 40)
        assert torch.equal(got, silu_mul(gate.contiguous(), up.contiguous()))       # strides change nothing
        want = (torch.nn.functional.silu(gate.float()) * up.float())
        assert (got.float() - want).abs().max().item() <= 0.05 * want.abs().max().item()


if IN_CHILD:
    def test_child_silu_mul_on_fused_halves():
        check_silu_mul_on_fused_halves()
else:
    def test_silu_mul_on_fused_halves_under_the_interpreter():
        pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")
        run_child(__file__, CHILD_FLAG)


def test_layers_fuse_at_construction_and_loading_writes_into_the_fused_weights():
    """q|k|v and gate|up are fused when the layer is built, so load_into (which copies in place) fills the fused
    weights: nothing is fused, copied or freed after the load (a GPU's allocator kept those freed copies)."""
    from voxflow.layers.mlp import SwiGLU
    from voxflow.layers.qwen3_layer import Qwen3Attention
    from voxflow.models.qwen3_tts.weights import load_into
    attn, mlp = Qwen3Attention(32, 4, 2, 16, 1e-6), SwiGLU(32, 48)
    qkv, gate_up = attn._qkv, mlp._gate_up
    assert still_fused(qkv, [attn.q_proj, attn.k_proj, attn.v_proj]) and still_fused(gate_up, [mlp.gate_proj,
                                                                                                  mlp.up_proj])
    for module, fused, names in ((attn, qkv, ("q_proj", "k_proj", "v_proj")), (mlp, gate_up, ("gate_proj", "up_proj"))):
        values = {k: torch.randn(v.shape) for k, v in module.state_dict().items()}
        load_into(module, values, what="layer")
        assert torch.equal(fused, torch.cat([values[f"{n}.weight"] for n in names]))
    assert attn.fused_qkv() is qkv and mlp.fused_gate_up() is gate_up
