"""The codec's fused SnakeBeta activation (voxflow/kernels/snake_beta.py) against the torch module, on CPU tensors
through Triton's interpreter (in a subprocess, see tests/interpreter_child.py).

Tolerances: the interpreter's sin is numpy's, torch's CPU sin its own vectorised one: a 1-ulp difference in sin(t)
becomes a few ulp of the scaled square, which near cancellation (x ~ -inv * sin^2) is many ulp of a tiny output.
So the error is bounded against the terms' scale: |got - ref| <= 4 * eps(dtype) * (|x| + inv) per element, and
>= 90% of the elements bit-equal (same rounding points). On CUDA both use sinf and the GPU test holds them
bit-exact.
"""
from __future__ import annotations

import pytest
import torch

from float_compare import ulp_distance  # tests/float_compare.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_SNAKE_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def assert_close_to(got, want, x, inv):
    eps = torch.finfo(want.dtype).eps
    bound = 4 * eps * (x.float().abs() + inv.float()[None, :, None])
    err = (got.float() - want.float()).abs()
    assert (err <= bound).all(), (err / bound).max().item()
    assert (ulp_distance(got, want) == 0).float().mean().item() >= 0.9


def module(channels, dtype, seed):
    from voxflow.models.qwen3_tts.codec_decoder_blocks import SnakeBeta
    torch.manual_seed(seed)
    m = SnakeBeta(channels)
    m.alpha.data.uniform_(-1.0, 1.0)
    m.beta.data.uniform_(-1.0, 1.0)
    return m.to(dtype).eval().requires_grad_(False)


def check_against_the_module():
    from voxflow.kernels.snake_beta import snake_beta, supported
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for b, c, t in ((1, 3, 5), (2, 16, 1500), (3, 7, 1025)):
            m = module(c, dtype, seed=c)
            x = (torch.randn(b, c, t, generator=g) * 3).to(dtype)
            a, inv = m._channel_terms()
            assert supported(x, a, inv)
            want = m(x)                                                   # the torch expression (CPU)
            assert_close_to(snake_beta(x, a, inv), want, x, inv)
            strided = torch.randn(b, t, c, generator=g).to(dtype).transpose(1, 2)[:, :, :]   # channel stride 1
            assert not supported(strided, a, inv)                         # unit last stride only
            sliced = x[:, :, 1:]                                          # row stride != T: strides followed
            assert_close_to(snake_beta(sliced, a, inv), m(sliced), sliced, inv)


def check_module_dispatch_and_term_cache():
    """The module calls the kernel when kernels are on for x, with terms computed once per weight version."""
    import voxflow.models.qwen3_tts.codec_decoder_blocks as blocks
    m = module(4, torch.float32, seed=1)
    x = torch.randn(2, 4, 9)
    want = m(x)
    saved = blocks.use_kernels
    blocks.use_kernels = lambda t: True
    try:
        got = m(x)
        terms = m._derived
        assert terms is not None and m(x) is not None and m._derived is terms           # cached
        with torch.no_grad():
            m.alpha.add_(0.5)                                                          # new weight version
        m(x)
        assert m._derived is not terms
    finally:
        blocks.use_kernels = saved
    assert_close_to(got, want, x, terms[1][1])


def check_bias_fusions():
    """The convolution bias folded into SnakeBeta's pass and into the residual add: the same values as the separate
    adds (bias_residual's two rounded adds are exact float ops, so bit-equal); a residual unit's fused path equals
    its plain one."""
    from voxflow.kernels.snake_beta import bias_residual, bias_residual_supported, snake_beta, supported
    from voxflow.models.qwen3_tts.codec_decoder_blocks import ResidualUnit
    import voxflow.models.qwen3_tts.codec_decoder_blocks as blocks
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        m = module(6, dtype, seed=3)
        x = (torch.randn(2, 6, 700, generator=g) * 3).to(dtype)
        bias = torch.randn(6, generator=g).to(dtype)
        a, inv = m._channel_terms()
        assert supported(x, a, inv, bias) and not supported(x, a, inv, bias.float() if dtype != torch.float32
                                                                  else bias.double())
        shifted = x + bias[:, None]
        assert_close_to(snake_beta(x, a, inv, bias), m(shifted), shifted, inv)
        h = torch.randn(2, 6, 700, generator=g).to(dtype)
        assert bias_residual_supported(h, bias, x)
        assert torch.equal(bias_residual(h, bias, x), (h + bias[:, None]) + x)
    torch.manual_seed(0)
    unit = ResidualUnit(5, dilation=3).eval().requires_grad_(False)
    for act in (unit.act1, unit.act2):
        act.alpha.data.uniform_(-1.0, 1.0)
        act.beta.data.uniform_(-1.0, 1.0)
    unit.conv1.state_key, unit.conv2.state_key = "conv1", "conv2"
    x = torch.randn(2, 5, 300, generator=g)
    want = unit(x)
    saved = blocks.use_kernels
    blocks.use_kernels = lambda t: True
    try:
        got = unit(x)
        # streamed in pieces (act1 written after conv1's carried context in one buffer): the one-pass output
        state = {**unit.conv1.init_state(2, "cpu", torch.float32), **unit.conv2.init_state(2, "cpu", torch.float32)}
        streamed = torch.cat([unit(x[..., a:e], state) for a, e in ((0, 7), (7, 100), (100, 300))], -1)
    finally:
        blocks.use_kernels = saved
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(streamed, want, rtol=1e-5, atol=1e-5)
    # snake_beta into a slice of a larger buffer (the out= path)
    m = module(5, torch.float32, seed=4)
    a, inv = m._channel_terms()
    buf = torch.full((2, 5, 310), 7.0)
    snake_beta(x, a, inv, out=buf[..., 10:])
    assert (buf[..., :10] == 7.0).all()
    assert_close_to(buf[..., 10:], m(x), x, inv)


if IN_CHILD:
    def test_child_against_the_module():
        check_against_the_module()

    def test_child_bias_fusions():
        check_bias_fusions()

    def test_child_dispatch_and_cache():
        check_module_dispatch_and_term_cache()
else:
    def test_snake_beta_kernel_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
