"""Every Triton kernel compiles for the H200 (sm_90) -- Triton's real compiler and ptxas, no GPU needed
(voxflow/kernels/compile_check.py). The interpreter tests check what the kernels compute; this catches what only
the GPU compiler rejects before device time is spent on it. A deliberately broken kernel must fail the same way."""
from __future__ import annotations

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
