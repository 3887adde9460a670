"""Programmatic dependent launch (voxflow/kernels/pdl.py, VOXFLOW_PDL, on by default on Hopper) on the GPU: the GEMM
kernels that take it (norm_linear, skinny_linear, attention_o_proj) give bit-identical results with it on and off,
alone, chained (each kernel reading the one before's output), and replayed from a CUDA graph with new inputs; the
1.7B code predictor's whole frame (70 fused layer steps) too. PDL changes when a kernel starts, never what it
computes: any difference means a read before griddepcontrol.wait. Both tests also run with the weight preload
(pdl.py: the one-row GEMMs' first weight tiles loaded before the wait) and with every kind on the exit trigger,
which must give the same bits. The other
decode kernels that take it (qk_norm_rope, paged decode, select_tokens, ...) are held on / off through the whole
engine: tests/gpu/test_gpu_engine.py. Skipped without a Hopper-class GPU."""
import pytest
import torch

from cp_layer_reference import make_code_predictor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                reason="needs a CUDA GPU of compute capability >= 9 (run on the device machine)")
DEV = "cuda"


@pytest.fixture(params=[(False, "none"), (True, "none"), (False, "all"), (True, "default")],
                ids=["wait", "preload", "exit", "as-served"])
def pdl(request):
    """switch(on): PDL on / off with the kernels on (both process-wide; an engine made earlier may have turned the
    kernels off), asserting that the kernels do take PDL when it is on; with PDL on, the weight preload as the
    parameter says, and every kind on the early trigger, every kind on the exit trigger (exit), or the kinds the
    process was started with (as-served: attention_o_proj by default; pdl.trigger_mode)."""
    from voxflow.kernels import kernels_enabled, pdl_enabled, set_kernels_enabled, set_pdl_enabled, use_pdl
    from voxflow.kernels import pdl as pdl_module
    saved = pdl_enabled(), kernels_enabled(), pdl_module._preload, pdl_module.PRELOAD_MIN_WIDTH, pdl_module._exit
    set_kernels_enabled(True)
    pdl_module.PRELOAD_MIN_WIDTH = 0            # every width here (the default takes the talker's only)
    preload, exits = request.param
    pdl_module._exit = {"none": frozenset(), "all": frozenset(pdl_module.EXIT_KINDS), "default": saved[4]}[exits]
    attention_exits = exits == "all" or (exits == "default" and "attention_o_proj" in saved[4])

    def switch(on: bool):
        set_pdl_enabled(on)
        pdl_module.set_weight_preload(preload)
        assert use_pdl(torch.empty(1, device=DEV)) is on
        assert pdl_module.weight_preload(on) is (on and preload)
        assert pdl_module.trigger_mode(on, "attention_o_proj") == (
            pdl_module.OFF if not on else pdl_module.EXIT if attention_exits else pdl_module.EARLY)
    yield switch
    set_pdl_enabled(saved[0])
    set_kernels_enabled(saved[1])
    pdl_module.set_weight_preload(saved[2])
    pdl_module.PRELOAD_MIN_WIDTH = saved[3]
    pdl_module._exit = saved[4]


def chain(x, ws, nw):
    """norm_linear -> skinny_linear -> norm_linear: each reads the previous kernel's output."""
    from voxflow.kernels.norm_linear import norm_linear
    from voxflow.kernels.skinny_linear import skinny_linear
    h = norm_linear(x, ws[0], nw, 1e-6)                       # [1, 3072]
    h = skinny_linear(h, ws[1], residual=x)                   # [1, 1024] + x
    return norm_linear(h, ws[2], nw, 1e-6, swiglu=True)       # [1, 3072]


def test_chained_kernels_equal_with_pdl_on_and_off_eager_and_graphed(pdl):
    g = torch.Generator(device=DEV).manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(1, 1024, generator=g, device=DEV).to(bf)
    nw = (torch.rand(1024, generator=g, device=DEV) + 0.5).to(bf)
    ws = [(torch.randn(*shape, generator=g, device=DEV) * 0.03).to(bf)
          for shape in ((3072, 1024), (1024, 3072), (6144, 1024))]
    pdl(False)
    want = chain(x, ws, nw)
    pdl(True)
    assert torch.equal(chain(x, ws, nw), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x, ws, nw)
    x2 = torch.randn(1, 1024, generator=g, device=DEV).to(bf)
    x.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    pdl(False)
    assert torch.equal(out, chain(x2, ws, nw))


@torch.no_grad()
def test_code_predictor_frame_equals_with_pdl_on_and_off(pdl):
    """A 1.7B code-predictor frame at one row (the four fused kernels a layer step, 70 steps): eagerly, and captured
    in a CUDA graph replayed on new inputs (back to back on the GPU, where a read before the wait would show)."""
    cp = make_code_predictor(torch.bfloat16, DEV)
    h = (torch.randn(1, 2048, device=DEV) * 2).to(torch.bfloat16)
    c0 = torch.randn(1, 2048, device=DEV).to(torch.bfloat16)
    greedy = lambda logits, j: logits.argmax(-1)          # noqa: E731
    pdl(False)
    codes_off, logits_off = cp.predict(h, c0, greedy)
    pdl(True)
    codes_on, logits_on = cp.predict(h, c0, greedy)
    assert torch.equal(codes_on, codes_off) and torch.equal(logits_on, logits_off)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes_g, logits_g = cp.predict(h, c0, greedy)
    h2, c02 = (torch.randn(1, 2048, device=DEV) * 2).to(torch.bfloat16), torch.randn(1, 2048, device=DEV).to(h.dtype)
    h.copy_(h2)
    c0.copy_(c02)
    graph.replay()
    torch.cuda.synchronize()
    pdl(False)
    codes_want, logits_want = cp.predict(h2, c02, greedy)
    assert torch.equal(codes_g, codes_want) and torch.equal(logits_g, logits_want)
