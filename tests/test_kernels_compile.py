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
