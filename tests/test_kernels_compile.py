"""Every Triton kernel compiles for the H200 (sm_90) -- Triton's real compiler and ptxas, no GPU needed
(voxflow/kernels/compile_check.py). The interpreter tests check what the kernels compute; this catches what only
the GPU compiler rejects before device time is spent on it. A deliberately broken kernel must fail the same way."""
from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be compiled")
tl = pytest.importorskip("triton.language")

from voxflow.kernels import compile_check  # noqa: E402


def test_every_kernel_compiles_for_sm90():
    failed = {name: error for name, error in compile_check.compile_all().items() if error is not None}
    assert not failed, failed


@triton.jit
def _broken(x_ptr, BLOCK: tl.constexpr):
    a = tl.load(x_ptr + tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :])
    tl.store(x_ptr + tl.arange(0, BLOCK)[:, None], tl.dot(a, a))       # dot needs tiles of at least 16


def test_the_check_catches_a_kernel_the_gpu_compiler_rejects():
    with pytest.raises(Exception):
        compile_check.compile_kernel(_broken, dict(x_ptr="*bf16"), dict(BLOCK=4))


def test_pdl_variants_wait_before_any_memory_access_and_the_others_do_not_wait():
    """voxflow/kernels/pdl.py's rule in the generated PTX: a kernel compiled with USE_PDL runs griddepcontrol.wait
    before any global load or store, then launch_dependents; the same kernel without it has none of these
    instructions."""
    cases = {name: rest for name, *rest in compile_check.cases()}
    pdl_names = [name for name in cases if name.endswith(" pdl")]
    assert pdl_names
    for name in pdl_names:
        for variant in (name, name[: -len(" pdl")]):
            fn, types, consts, options = cases[variant]
            ptx = compile_check.compile_kernel(fn, types, consts, **options)["ptx"]
            if variant == name:
                wait = ptx.find("griddepcontrol.wait")
                trigger = ptx.find("griddepcontrol.launch_dependents")
                assert 0 <= wait < trigger, (name, wait, trigger)
                accesses = [i for op in ("ld.global", "st.global", "atom.global", "red.global", "cp.async",
                                         "prefetch.global")
                            if (i := ptx.find(op)) >= 0]
                assert accesses and min(accesses) > wait, f"{name}: a global access before griddepcontrol.wait"
            else:
                assert "griddepcontrol" not in ptx and "prefetch.global" not in ptx, variant


def test_exit_trigger_variants_wait_first_and_never_trigger_early():
    """pdl.EXIT: the wait before any global access, as with EARLY, and no launch_dependents at all (the next kernel
    is launched when this one's programs have exited); the EARLY twin of each has the trigger."""
    cases = {name: rest for name, *rest in compile_check.cases()}
    exit_names = [name for name in cases if name.endswith(" pdl exit")]
    assert len(exit_names) >= 2
    for name in exit_names:
        fn, types, consts, options = cases[name]
        ptx = compile_check.compile_kernel(fn, types, consts, **options)["ptx"]
        wait = ptx.find("griddepcontrol.wait")
        accesses = [i for op in ("ld.global", "st.global", "atom.global", "red.global") if (i := ptx.find(op)) >= 0]
        assert 0 <= wait < min(accesses), name
        assert "griddepcontrol.launch_dependents" not in ptx, name
        fn, types, consts, options = cases[name[: -len(" exit")]]
        assert "griddepcontrol.launch_dependents" in compile_check.compile_kernel(fn, types, consts, **options)["ptx"]


def test_trigger_mode_takes_exit_only_for_listed_kinds_without_a_preload(monkeypatch):
    from voxflow.kernels import pdl
    monkeypatch.setattr(pdl, "_exit", frozenset({"norm_linear"}))
    assert pdl.trigger_mode(False, "norm_linear") == pdl.OFF
    assert pdl.trigger_mode(True, "norm_linear") == pdl.EXIT
    assert pdl.trigger_mode(True, "norm_linear", preload=True) == pdl.EARLY      # its preload needs the early start
    assert pdl.trigger_mode(True, "skinny_linear") == pdl.EARLY


def test_weight_preload_variants_load_before_the_wait_but_store_nothing_there():
    """pdl.py's one exception: with the weight preload the one-row GEMMs issue loads (their first W tiles) before
    griddepcontrol.wait -- that is the change -- and still nothing is stored before it; their PDL twins without
    the preload keep the strict rule (the test above). (PTX alone does not tell a weight load from an activation
    load: tests/gpu/test_gpu_pdl.py's bit-equal chained and graphed runs are what would show an activation read
    before the wait.)"""
    cases = {name: rest for name, *rest in compile_check.cases()}
    preload_names = [name for name in cases if name.endswith(" pdl preload")]
    assert {name.split(" ")[0] for name in preload_names} == {"norm_linear", "skinny_linear"}
    for name in preload_names:
        assert name[: -len(" preload")] in cases, name
        fn, types, consts, options = cases[name]
        ptx = compile_check.compile_kernel(fn, types, consts, **options)["ptx"]
        wait = ptx.find("griddepcontrol.wait")
        assert 0 <= wait < ptx.find("griddepcontrol.launch_dependents"), name
        assert 0 <= ptx.find("ld.global") < wait, f"{name}: no weight load before the wait"
        stores = [i for op in ("st.global", "atom.global", "red.global") if (i := ptx.find(op)) >= 0]
        assert stores and min(stores) > wait, f"{name}: a store before griddepcontrol.wait"


def test_weight_preload_needs_pdl_the_switch_and_the_width(monkeypatch):
    from voxflow.kernels import pdl
    monkeypatch.setattr(pdl, "_preload", True)
    monkeypatch.setattr(pdl, "PRELOAD_MIN_WIDTH", 2048)
    assert pdl.weight_preload(True, 4096, 2048) and pdl.weight_preload(True, 2048, 6144)    # the 1.7B talker's
    assert not pdl.weight_preload(True, 4096, 1024) and not pdl.weight_preload(True, 1024, 3072)   # the predictor's
    assert not pdl.weight_preload(False, 4096, 2048)
    assert not pdl.weight_preload(True, 4096, 2048, m=4)                   # one row only
    monkeypatch.setattr(pdl, "_preload", False)
    assert not pdl.weight_preload(True, 4096, 2048)


def test_pdl_needs_cuda_12_3_and_a_triton_with_griddepcontrol(monkeypatch):
    """use_pdl's toolchain check: no CUDA build or CUDA < 12.3 (graphs drop programmatic launches) -> off; a Triton
    without gdc_wait -> off; otherwise on (this Triton has it: the PDL variants above compile)."""
    import torch

    from voxflow import kernels
    for cuda, want in ((None, False), ("12.2", False), ("12.3", True), ("13.0", True)):
        monkeypatch.setattr(torch.version, "cuda", cuda)
        kernels._pdl_toolchain.cache_clear()
        assert kernels._pdl_toolchain() is want, cuda
    monkeypatch.delattr(tl.extra.cuda, "gdc_wait")
    kernels._pdl_toolchain.cache_clear()
    assert kernels._pdl_toolchain() is False
    monkeypatch.undo()
    kernels._pdl_toolchain.cache_clear()


def test_tensor_core_tiles_keep_one_shared_buffer_per_pipeline_stage():
    """The codec's convolutions (tensor-core GEMMs pipelined by Triton): every operand tile staged in shared memory has
    num_stages buffers. Triton's pipeliner gives a loaded tile with a register user besides the async wgmma one
    buffer fewer, and then the copy for step i + num_stages - 1 overwrites the buffer wgmma i may still read
    (session 13 hit it: a decode GEMM that also summed the squares of its x tile gave wrong results on the H200,
    benchmarks/results/h200/2026-12-02-session13). A kernel that reads a dot operand's tile outside tl.dot fails
    here. The check's own sanity: such a kernel does show the short buffer."""
    cases = [(name, *rest) for name, *rest in compile_check.cases()
             if name in ("conv_channels_last fp32 768->768 k=7 SNAKE", "conv_channels_last bf16 384->384 k=1 RESIDUAL")]
    assert len(cases) == 2
    for name, fn, types, consts, options in cases:
        buffers = _shared_buffers(compile_check.compile_kernel(fn, types, consts, **options)["ttgir"])
        assert buffers and all(b == options["num_stages"] for b in buffers), (name, buffers)
    plain = _shared_buffers(_dot_tile_ttgir(with_register_user=False))[0]      # the x tile: one buffer a stage
    assert plain == 4 and min(_shared_buffers(_dot_tile_ttgir(with_register_user=True))) < plain


def _shared_buffers(ttgir: str) -> list[int]:
    """The leading (buffer-count) dimension of every shared-memory allocation in a TTGIR listing."""
    return [int(b) for b in re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<(\d+)x", ttgir)]


@triton.jit
def _dot_tile(x_ptr, w_ptr, out_ptr, K, REGISTER_USER: tl.constexpr):
    offs = tl.arange(0, 64)
    acc = tl.zeros((64, 64), tl.float32)
    sq = tl.zeros((64,), tl.float32)
    for k0 in range(0, K, 64):
        a = tl.load(x_ptr + offs[:, None] * K + k0 + offs[None, :])
        if REGISTER_USER:
            sq += tl.sum(a.to(tl.float32) * a.to(tl.float32), axis=1)
        acc = tl.dot(a, tl.load(w_ptr + offs[:, None] * K + k0 + offs[None, :]).T, acc)
    tl.store(out_ptr + offs[:, None] * 64 + offs[None, :], acc + sq[:, None])


def _dot_tile_ttgir(with_register_user: bool) -> str:
    return compile_check.compile_kernel(_dot_tile, dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*fp32"),
                                        dict(REGISTER_USER=with_register_user), num_warps=4, num_stages=4,
                                        aligned=("x_ptr", "w_ptr", "out_ptr", "K"))["ttgir"]


def test_fast_epilogue_sin_reaches_the_convolution_only_where_products_are_inexact(monkeypatch):
    """causal_conv.epilogue_sin_mode: with FAST_EPILOGUE_SIN (the default) the hardware's sin.approx for TF32 / bf16 /
    fp16 convolutions, libdevice's sinf (torch's bits) for exact fp32 ones or with the switch off; the interpreter's
    sin off CUDA. conv1d_channels_last launches with the mode it returns (and with a tuned config's register cap), and
    the compiled 96-channel convolution carries sin.approx with mode 2 and not with mode 1."""
    import os

    import torch
    from voxflow.kernels import causal_conv
    if "VOXFLOW_CONV_FAST_SIN" not in os.environ:
        assert causal_conv.FAST_EPILOGUE_SIN
    case = next(c for c in compile_check.cases() if c[0] == "conv_channels_last fp32 96->96 k=7 SNAKE libdevice sin")
    monkeypatch.setattr(causal_conv, "FAST_EPILOGUE_SIN", False)
    modes = ((torch.float32, "tf32"), (torch.bfloat16, "ieee"), (torch.float16, "ieee"), (torch.float32, "ieee"))
    assert [causal_conv.epilogue_sin_mode(True, dt, p) for dt, p in modes] == [1, 1, 1, 1]
    monkeypatch.setattr(causal_conv, "FAST_EPILOGUE_SIN", True)
    assert [causal_conv.epilogue_sin_mode(True, dt, p) for dt, p in modes] == [2, 2, 2, 1]
    assert causal_conv.epilogue_sin_mode(False, torch.bfloat16, "ieee") == 0
    launched = {}

    class Spy:                                    # stands in for the kernel: records the launch's constexprs
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.update(kw)

    monkeypatch.setattr(causal_conv, "_conv_cl_kernel", Spy())
    monkeypatch.setattr(causal_conv, "epilogue_sin_mode", lambda is_cuda, dtype, precision: ("mode", dtype, precision))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    causal_conv.conv1d_channels_last(torch.zeros(1, 9, 16), torch.zeros(3, 16, 16), None, 1)
    assert launched["PRECISE"] == ("mode", torch.float32, "ieee") and "maxnreg" not in launched
    # a tuned config's register cap reaches the launch (two 8-warp blocks an SM: conv_occupancy.py)
    monkeypatch.setitem(causal_conv.TUNED, (16, 16, 3, torch.float32), causal_conv._cfg(64, 16, 16, 4, 2, 96))
    causal_conv.conv1d_channels_last(torch.zeros(1, 9, 16), torch.zeros(3, 16, 16), None, 1)
    assert launched["maxnreg"] == 96 and launched["BLOCK_T"] == 64
    # fp16 launches with bf16's tuned config where it has none of its own (same element size and tensor-core rate)
    monkeypatch.setitem(causal_conv.TUNED, (16, 16, 3, torch.bfloat16), causal_conv._cfg(32, 16, 16, 4, 2, 80))
    causal_conv.conv1d_channels_last(torch.zeros(1, 9, 16, dtype=torch.float16),
                                     torch.zeros(3, 16, 16, dtype=torch.float16), None, 1)
    assert launched["maxnreg"] == 80 and launched["BLOCK_T"] == 32
    assert launched["PRECISE"] == ("mode", torch.float16, "ieee")
    _, kernel, types, consts, options = case
    options = dict(options)
    aligned = options.pop("aligned", ())
    ptx = {mode: compile_check.compile_kernel(kernel, types, {**consts, "PRECISE": mode}, aligned=aligned,
                                              **options)["ptx"] for mode in (1, 2)}
    assert "sin.approx" in ptx[2] and "sin.approx" not in ptx[1]          # (.ftz.f32 or .f32)
