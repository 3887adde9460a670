"""The fused counter-based noise kernel == batch_sampling's int64 torch reference, bit for bit (CPU: Triton's
interpreter in a subprocess, since TRITON_INTERPRET must be set before triton is first imported; GPU: tests/gpu)."""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_NOISE_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def cases():
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2 ** 32, (5,), generator=g, dtype=torch.long)
    keys[0], keys[1] = 0, 2 ** 32 - 1
    frames = torch.tensor([0, 1, 4095, 2 ** 28 + 3, 2 ** 40 + 7])        # wraps like the reference's mask
    return [(keys, frames, cb, vocab) for cb, vocab in ((0, 3072), (5, 2048), (15, 37))]


def check_bit_exact():
    from voxflow.kernels.uniform_noise import uniform_noise as fused
    from voxflow.models.qwen3_tts.batch_sampling import uniform_noise as reference
    for keys, frames, cb, vocab in cases():
        got, want = fused(keys, frames, cb, vocab), reference(keys, frames, cb, vocab)
        assert got.shape == want.shape and torch.equal(got, want), (cb, vocab)
        assert bool(((got > 0) & (got < 1)).all())


if IN_CHILD:
    def test_child_bit_exact():
        check_bit_exact()
else:
    def test_noise_kernel_under_the_interpreter_is_bit_exact():
        run_child(__file__, CHILD_FLAG)
