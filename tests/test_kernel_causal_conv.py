"""The channels-last codec kernels (voxflow/kernels/causal_conv.py) and the waveform stack built on them
(voxflow/models/qwen3_tts/codec_waveform_cl.py) against the plain PyTorch modules, on CPU tensors through Triton's
interpreter (in a subprocess, see tests/interpreter_child.py).

Tolerances: fp32 convolutions sum in another order than PyTorch's (and the interpreter's dot is numpy's fp32 matmul):
1e-5 relative to the sum of |terms|. bf16 / fp16: both sides compute in fp32 and round where torch stores, so they
differ where an fp32 sum lands on the other side of a rounding boundary: within 2 ulps of the output (2^-7 relative in
bf16, 2^-10 in fp16) plus the input rounding of the reference's own low-precision convolution, which is rounded again
before the epilogue. The waveform stack streamed in pieces must equal the plain decoder's one pass within 1e-4 (fp32;
the same bound test_codec_decoder.py holds streaming to).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_CAUSAL_CONV_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def snake_ref(x, a, inv):
    """SnakeBeta on [B, C, T] with per-channel a / inv (the module's torch expression)."""
    return x + inv[None, :, None] * torch.sin(x * a[None, :, None]).pow(2)


def check_conv_against_torch():
    from voxflow.kernels import causal_conv
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    g = torch.Generator().manual_seed(0)
    tma_calls = []
    tma_kernel = causal_conv._conv_tma
    # (the child's own process)
    causal_conv._conv_tma = lambda *args, **kw: (tma_calls.append(1), tma_kernel(*args, **kw))
    # (B, T, Cin, Cout, k, dilation): masked channel tiles (96 -> 128), k blocks not dividing Cin, T not a multiple
    # of the 128-row tile, the 1x1 conv, the one-channel output conv; Cin 64 / 128: whole k blocks (EVEN_K)
    # (and for the TMA kernel, which tiles each sequence apart: one sequence of several tiles, a last one partial)
    shapes = ((2, 130, 24, 24, 7, 3), (1, 50, 40, 96, 7, 9), (3, 129, 48, 20, 1, 1), (2, 70, 12, 1, 7, 1),
              (2, 40, 64, 32, 7, 1), (1, 30, 128, 16, 1, 1), (1, 300, 32, 40, 7, 2), (2, 256, 32, 40, 7, 2))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for b, t, cin, cout, k, d in shapes:
            ctx = (k - 1) * d
            x_ncl = (torch.randn(b, cin, ctx + t, generator=g)).to(dtype)
            w = (torch.randn(cout, cin, k, generator=g) / (cin * k) ** 0.5).to(dtype)
            bias = (torch.randn(cout, generator=g) * 0.1).to(dtype)
            a = (torch.rand(cout, generator=g) + 0.5).to(dtype)
            inv = (torch.rand(cout, generator=g) + 0.5).to(dtype)
            res_ncl = torch.randn(b, cout, t, generator=g).to(dtype)
            x = x_ncl.transpose(1, 2).contiguous()
            packed = pack_weight(w)
            assert packed.shape == (k, cout, cin)
            exact = F.conv1d(x_ncl.double(), w.double(), None, dilation=d)          # [B, Cout, T], no rounding
            scale = F.conv1d(x_ncl.double().abs(), w.double().abs(), None, dilation=d)
            for epilogue in ("bias", "snake", "residual"):
                kwargs = {}
                want = (exact.to(dtype).double() + bias.double()[None, :, None]).to(dtype)
                if epilogue == "snake":
                    kwargs["snake_terms"] = (a, inv)
                    want = snake_ref(want.float(), a.float(), inv.float()).to(dtype)
                if epilogue == "residual":
                    kwargs["residual"] = res_ncl.transpose(1, 2).contiguous()
                    want = (want.float() + res_ncl.float()).to(dtype)
                # pointer loads, then TMA descriptors where the operands allow them (the TMA kernel spied on)
                for tma in (False, True):
                    ran = len(tma_calls)
                    got = conv1d_channels_last(x, packed, bias, d, tma=tma, **kwargs)
                    block_t = causal_conv.launch_config(cin, cout, dtype, k)["BLOCK_T"]
                    takes = causal_conv.tma_fits(x, packed) and causal_conv._sequence_tiles_waste_little(b, t, block_t)
                    assert len(tma_calls) - ran == (1 if tma and takes else 0)
                    assert got.shape == (b, t, cout) and got.dtype == dtype
                    got = got.transpose(1, 2).double()
                    if dtype == torch.float32:
                        bound = 1e-5 * (scale + 1.0)
                    else:
                        # conv rounding (the reference stores the bf16 / fp16 conv first) + 2 ulps of what follows
                        mag = (scale + want.double().abs() + 1.0)
                        bound = 2 * torch.finfo(dtype).eps * mag
                    if epilogue == "snake":                   # sin's slope <= a * 2 inv: an input error grows by it
                        bound = bound * (1 + 2 * (a.double() * inv.double()))[None, :, None]
                    err = (got - want.double()).abs()
                    assert (err <= bound).all(), (dtype, (b, t, cin, cout, k, d), epilogue, tma,
                                                  (err / bound).max().item())
                    assert want.abs().max() > 0.1                     # not a comparison of zeros
    # the TMA path where rows are 16-byte multiples (not 12 channels in 16 bits) and sequences fill their tiles
    assert len(tma_calls) == 39
    # the default (tma=None): TMA on (CONV_TMA, unless VOXFLOW_CONV_TMA=0) for fp16 CUDA tensors only; a CPU tensor
    # the TMA kernel would take still runs the pointer kernel
    assert causal_conv.CONV_TMA == (os.environ.get("VOXFLOW_CONV_TMA", "1") == "1")
    conv_tma, by_default = causal_conv.CONV_TMA, causal_conv.tma_by_default
    causal_conv.CONV_TMA = True
    try:
        w = torch.randn(40, 32, 7, generator=g) / 15
        x32 = torch.randn(1, 312, 32, generator=g)
        for dtype in (torch.float16, torch.bfloat16):
            x, packed = x32.to(dtype), pack_weight(w.to(dtype))
            block_t = causal_conv.launch_config(32, 40, dtype, 7)["BLOCK_T"]
            assert causal_conv.tma_fits(x, packed) and causal_conv._sequence_tiles_waste_little(1, 300, block_t)
            want = conv1d_channels_last(x, packed, None, 2, tma=False)
            assert torch.equal(conv1d_channels_last(x, packed, None, 2), want) and len(tma_calls) == 39
        # the default's dtype rule as on a CUDA device (tma_by_default told the tensor is on one): fp16 takes the
        # TMA kernel, bf16 keeps the pointer kernel
        causal_conv.tma_by_default = lambda is_cuda, dtype: by_default(True, dtype)
        for dtype, tma_runs in ((torch.float16, 1), (torch.bfloat16, 0)):
            ran = len(tma_calls)
            conv1d_channels_last(x32.to(dtype), pack_weight(w.to(dtype)), None, 2)
            assert len(tma_calls) - ran == tma_runs, dtype
    finally:
        causal_conv.CONV_TMA, causal_conv.tma_by_default = conv_tma, by_default


def check_snake_channels_last():
    from voxflow.kernels.causal_conv import snake_channels_last
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for b, t, c in ((2, 33, 5), (1, 300, 96)):
            x = (torch.randn(b, t, c, generator=g) * 3).to(dtype)
            a = (torch.rand(c, generator=g) + 0.5).to(dtype)
            inv = (torch.rand(c, generator=g) + 0.5).to(dtype)
            want = snake_ref(x.transpose(1, 2).float(), a.float(), inv.float()).transpose(1, 2)
            eps = torch.finfo(dtype).eps
            bound = 8 * eps * (x.float().abs() + inv.float() + 1)
            assert ((snake_channels_last(x, a, inv).float() - want).abs() <= bound).all()
            buf = torch.full((b, t + 4, c), 7.0, dtype=dtype)          # into rows after a context
            snake_channels_last(x, a, inv, out=buf[:, 4:])
            assert (buf[:, :4] == 7.0).all()
            assert ((buf[:, 4:].float() - want).abs() <= bound).all()


def check_split_n_equals_one_tile():
    """The TMA kernel's columns in two accumulators (CONV_SPLIT_N: 96 = 64 + 32, 192 = 128 + 64 at k=7, 288 = 2 x
    (128 + 16)) against its one masked tile a column block, fp16, every epilogue the codec uses (SnakeBeta; residual;
    residual + the next SnakeBeta with the raw value kept; the next SnakeBeta with the raw value kept): the same
    sums over the same k blocks, so within one fp16 ulp of the output
    (the interpreter's dot is numpy's matmul, whose order may follow the tile's width); the split path was taken."""
    from voxflow.kernels import causal_conv
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    g = torch.Generator().manual_seed(11)
    dtype = torch.float16
    taken = []
    config, default = causal_conv.split_n_config, causal_conv.CONV_SPLIT_N
    causal_conv.split_n_config = lambda *a: (lambda c: (taken.append(c is not None), c)[1])(config(*a))
    try:
        # (sequences fill their 128-row tiles, but for the first's last one: _sequence_tiles_waste_little's TMA rule)
        # (the sub-pixel transposed convolution's 192 -> 288, k=2, with the next SnakeBeta and the raw value)
        for b, t, cin, c, k, d in ((1, 200, 96, 96, 7, 3), (1, 128, 192, 192, 7, 1), (2, 128, 96, 96, 1, 1),
                                   (1, 256, 192, 288, 2, 1)):
            x = torch.randn(b, t + (k - 1) * d, cin, generator=g).to(dtype)
            packed = pack_weight((torch.randn(c, cin, k, generator=g) / (cin * k) ** 0.5).to(dtype))
            bias = (torch.randn(c, generator=g) * 0.1).to(dtype)
            terms = [((torch.rand(c, generator=g) + 0.5).to(dtype), (torch.rand(c, generator=g) + 0.5).to(dtype))
                     for _ in range(2)]
            res = torch.randn(b, t, c, generator=g).to(dtype)
            # (raw_out: a template, each run gets its own)
            epilogues = {7: [dict(snake_terms=terms[0])], 2: [dict(activation=terms[1], raw_out=res)],
                         1: [dict(residual=res), dict(residual=res, activation=terms[1], raw_out=res)]}[k]
            for kwargs in epilogues:
                outs = []
                for split in (False, True):
                    causal_conv.CONV_SPLIT_N = split
                    kw = {key: (torch.empty_like(v) if key == "raw_out" else v) for key, v in kwargs.items()}
                    got = conv1d_channels_last(x, packed, bias, d, tma=True, **kw)
                    outs.append((got.float(), kw["raw_out"].float() if "raw_out" in kw else None))
                assert taken[-2:] == [False, True], (c, k)
                (one, raw_one), (two, raw_two) = outs
                for u, v in ((one, two), (raw_one, raw_two)):
                    if u is None:
                        continue
                    ulp = torch.finfo(dtype).eps * torch.maximum(u.abs(), v.abs()).clamp(min=2 ** -14)
                    assert ((u - v).abs() <= ulp).all(), (c, k, list(kwargs), ((u - v).abs() / ulp).max())
                    assert u.abs().max() > 0.1 and (u == v).float().mean() > 0.9
        # the shapes measured slower split (192 k=1) keep the one tile
        causal_conv.CONV_SPLIT_N = True
        assert causal_conv.split_n_config(192, 192, dtype, 1) is None
        assert causal_conv.split_n_config(96, 96, torch.bfloat16, 7) is None          # fp16 only
    finally:
        causal_conv.CONV_SPLIT_N = default
        causal_conv.split_n_config = config


def check_flat_tma_tiles_equal_the_pointer_kernel():
    """CONV_TMA_FLAT: the TMA kernel's tiles across the sequences of a contiguous batch (`tma_tiling` "flat", each
    sequence's context rows computed and dropped) where a sequence is too short for tiles of its own: the pointer
    kernel's output within an fp16 ulp (fp32: 1e-6), with every epilogue the codec uses, the output rows after a
    context (out=) and the rows there untouched; nothing stored past a sequence's T rows. A batch whose sequences are
    not contiguous (a view of a wider buffer), and a flat tiling that wastes over 1/8 of its tiles, take the pointer
    kernel."""
    from voxflow.kernels import causal_conv
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    g = torch.Generator().manual_seed(13)
    flat_calls = []
    tma_kernel, default = causal_conv._conv_tma, causal_conv.CONV_TMA_FLAT
    causal_conv._conv_tma = lambda *a, **k: (flat_calls.append(k.get("flat")), tma_kernel(*a, **k))
    causal_conv.CONV_TMA_FLAT = True
    try:
        # (B, T, Cin, Cout, k, dilation): the first upsampling convolution's sub-pixel shape in small (two taps, one
        # context row, 100 rows a sequence), a 1x1 and a k=7 one of short sequences, the split-N 96 (fp16)
        for b, t, cin, cout, k, d in ((5, 100, 32, 48, 2, 1), (7, 40, 32, 32, 1, 1), (9, 60, 16, 24, 7, 1),
                                      (6, 50, 96, 96, 7, 1)):
            for dtype in (torch.float32, torch.float16):
                x = torch.randn(b, t + (k - 1) * d, cin, generator=g).to(dtype)
                packed = pack_weight((torch.randn(cout, cin, k, generator=g) / (cin * k) ** 0.5).to(dtype))
                bias = (torch.randn(cout, generator=g) * 0.1).to(dtype)
                res = torch.randn(b, t, cout, generator=g).to(dtype)
                terms = [((torch.rand(cout, generator=g) + 0.5).to(dtype), (torch.rand(cout, generator=g) + 0.5)
                          .to(dtype)) for _ in range(2)]
                block_t = causal_conv.launch_config(cin, cout, dtype, k)["BLOCK_T"]
                assert causal_conv.tma_tiling(x, t, block_t) == "flat", (b, t, k)
                for kwargs in (dict(snake_terms=terms[0]), dict(residual=res, activation=terms[1])):
                    outs = []
                    for tma in (False, True):
                        buf = torch.full((b, 3 + t, cout), 9.0, dtype=dtype)
                        raw = torch.full((b, t, cout), 9.0, dtype=dtype) if "activation" in kwargs else None
                        ran = len(flat_calls)
                        conv1d_channels_last(x, packed, bias, d, tma=tma, out=buf[:, 3:], raw_out=raw, **kwargs)
                        assert flat_calls[ran:] == ([True] if tma else [])
                        assert (buf[:, :3] == 9.0).all()
                        outs.append([buf[:, 3:].float()] + ([raw.float()] if raw is not None else []))
                    for u, v in zip(*outs):
                        bound = (torch.finfo(dtype).eps if dtype == torch.float16 else 1e-6) * \
                            torch.maximum(u.abs(), v.abs()).clamp(min=2 ** -14)
                        assert ((u - v).abs() <= bound).all(), (b, t, k, dtype, ((u - v).abs() / bound).max())
                        assert (u != 9.0).all() and u.abs().max() > 0.1
        # not contiguous sequences: rows of a wider buffer; too much context for the rows: 8 rows of 62
        short, wide = torch.randn(5, 101, 32, generator=g), torch.randn(5, 120, 32, generator=g)
        assert causal_conv.tma_tiling(short, 100, 128) == "flat"
        assert causal_conv.tma_tiling(wide[:, :101], 100, 128) is None
        assert causal_conv.tma_tiling(torch.randn(40, 62, 8), 8, 128) is None
        causal_conv.CONV_TMA_FLAT = False
        assert causal_conv.tma_tiling(short, 100, 128) is None
        assert causal_conv.tma_tiling(torch.randn(1, 300, 8), 290, 128) == "sequence"
    finally:
        causal_conv._conv_tma, causal_conv.CONV_TMA_FLAT = tma_kernel, default


def check_activation_in_the_epilogue():
    """conv1d_channels_last's activation= (the next layer's SnakeBeta after the residual add), written into rows
    after a context (out=) and with the value before it kept (raw_out=): bit-equal to the convolution followed by
    the SnakeBeta pass it replaces (the same rounded value goes into the same snake steps; the interpreter's sin in
    both), by the pointer and the TMA kernel; the context rows untouched; misuse refused."""
    from voxflow.kernels import causal_conv
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight, snake_channels_last
    g = torch.Generator().manual_seed(7)
    tma_calls = []
    tma_kernel = causal_conv._conv_tma
    causal_conv._conv_tma = lambda *args, **kw: (tma_calls.append(1), tma_kernel(*args, **kw))
    try:
        # (B, T, Cin, Cout, k): the residual units' 1x1 shape (sequences of two tiles, the last partial) and a k=7
        # one with its own SnakeBeta before the residual; 16-byte rows in every dtype, so tma=True takes TMA
        for b, t, cin, cout, k in ((2, 200, 32, 32, 1), (1, 140, 16, 24, 7)):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                x = torch.randn(b, t + k - 1, cin, generator=g).to(dtype)
                packed = pack_weight((torch.randn(cout, cin, k, generator=g) / (cin * k) ** 0.5).to(dtype))
                bias = (torch.randn(cout, generator=g) * 0.1).to(dtype)
                res = torch.randn(b, t, cout, generator=g).to(dtype)
                terms = [((torch.rand(cout, generator=g) + 0.5).to(dtype), (torch.rand(cout, generator=g) + 0.5)
                          .to(dtype)) for _ in range(2)]
                before = dict(snake_terms=terms[0]) if k > 1 else {}
                for tma in (False, True):
                    ran = len(tma_calls)
                    y = conv1d_channels_last(x, packed, bias, 1, residual=res, tma=tma, **before)
                    want = snake_channels_last(y, *terms[1])
                    assert (want != y).float().mean() > 0.5                     # the activation changes it
                    buf = torch.full((b, 5 + t, cout), 9.0, dtype=dtype)
                    raw = torch.empty_like(y)
                    got = conv1d_channels_last(x, packed, bias, 1, residual=res, tma=tma, **before,
                                               activation=terms[1], out=buf[:, 5:], raw_out=raw)
                    assert got.data_ptr() == buf[:, 5:].data_ptr()
                    assert torch.equal(buf[:, 5:], want) and torch.equal(raw, y), (b, t, cin, cout, k, dtype, tma)
                    assert (buf[:, :5] == 9.0).all()
                    alone = conv1d_channels_last(x, packed, bias, 1, residual=res, tma=tma, **before,
                                                 activation=terms[1])
                    assert torch.equal(alone, want)
                    block_t = causal_conv.launch_config(cin, cout, dtype, k)["BLOCK_T"]
                    takes = causal_conv.tma_fits(x, packed) and causal_conv._sequence_tiles_waste_little(b, t, block_t)
                    assert len(tma_calls) - ran == (3 if tma and takes else 0), (dtype, k, tma)
                assert takes                                        # both kernels were held to the two passes
        x, packed = torch.randn(1, 10, 8), pack_weight(torch.randn(4, 8, 1))
        with pytest.raises(ValueError, match="needs one"):
            conv1d_channels_last(x, packed, None, raw_out=torch.empty(1, 10, 4))
        with pytest.raises(ValueError, match="out must be"):
            conv1d_channels_last(x, packed, None, out=torch.empty(1, 9, 4))
        with pytest.raises(ValueError, match="raw_out must be"):
            conv1d_channels_last(x, packed, None, activation=(torch.ones(4), torch.ones(4)),
                                 raw_out=torch.empty(1, 10, 4, dtype=torch.float16))
    finally:
        causal_conv._conv_tma = tma_kernel


def check_overlap_add():
    """The transposed convolution's overlap-add against the separate torch adds it replaces (conv_transpose_gemm's
    order): bit-equal, the same two rounded adds per element; the tail contiguous or a batch-strided view (the
    codec pool's gathered state). With the next layer's SnakeBeta (activation=): that pass's bits, into rows after
    a context."""
    from voxflow.kernels.causal_conv import overlap_add_channels_last, snake_channels_last
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for b, t, k, s, c in ((2, 5, 6, 3, 7), (1, 3, 16, 8, 20), (2, 4, 2, 2, 5)):
            gemm = torch.randn(b, t, k, c, generator=g).to(dtype)
            bias = torch.randn(c, generator=g).to(dtype)
            ov = k - s
            wide = torch.randn(b, c * ov + 3, generator=g).to(dtype)       # a batch-strided tail, as the pool's
            for tail in (None, torch.randn(b, c, ov, generator=g).to(dtype), wide[:, :c * ov].view(b, c, ov)):
                want = torch.empty(b, t, s, c, dtype=dtype)
                torch.add(gemm[:, :, :s], bias, out=want)
                if ov:
                    want[:, 1:, :ov] += gemm[:, :-1, s:]
                    if tail is not None:
                        want[:, 0, :ov] += tail.transpose(1, 2)
                got = overlap_add_channels_last(gemm, bias, s, tail)
                assert got.shape == (b, t * s, c)
                assert torch.equal(got, want.view(b, t * s, c)), (dtype, (b, t, k, s, c), tail is None)
                # the next layer's SnakeBeta in the same pass, into rows after a context: the pass it replaces
                a, inv = (torch.rand(c, generator=g) + 0.5).to(dtype), (torch.rand(c, generator=g) + 0.5).to(dtype)
                buf = torch.full((b, 3 + t * s, c), 9.0, dtype=dtype)
                raw = overlap_add_channels_last(gemm, bias, s, tail, (a, inv), buf[:, 3:])
                assert torch.equal(raw, got) and (buf[:, :3] == 9.0).all()
                assert torch.equal(buf[:, 3:], snake_channels_last(got, a, inv))
                assert not torch.equal(buf[:, 3:], got)
    with pytest.raises(ValueError, match="activation needs"):
        overlap_add_channels_last(gemm, bias, s, None, (a, inv))


def check_residual_unit_equals_the_two_kernels():
    """residual_unit.py's fused unit (k=7 + SnakeBeta, then 1x1 + bias + residual in one kernel) against the two
    channels-last kernels it replaces: fp32 within 1e-5 of the sum of |terms| (the 1x1 product sums in one step),
    bf16 within 2 bf16 ulps of the output's scale where a rounding flips; masked channel tiles (24 -> 32,
    96 -> 128), dilations 1 / 3 / 9, rows not a multiple of the 128-row tile."""
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    from voxflow.kernels.residual_unit import residual_unit_channels_last
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16):
        for b, t, c, d in ((2, 130, 24, 3), (1, 70, 96, 9), (3, 20, 16, 1)):
            x = torch.randn(b, t + 6 * d, c, generator=g).to(dtype)
            w7 = pack_weight((torch.randn(c, c, 7, generator=g) / (7 * c) ** 0.5).to(dtype))
            w1 = pack_weight((torch.randn(c, c, 1, generator=g) / c ** 0.5).to(dtype))
            b7, b1 = (torch.randn(c, generator=g) * 0.1).to(dtype), (torch.randn(c, generator=g) * 0.1).to(dtype)
            a = (torch.rand(c, generator=g) + 0.5).to(dtype)
            inv = (torch.rand(c, generator=g) + 0.5).to(dtype)
            res = torch.randn(b, t, c, generator=g).to(dtype)
            h = conv1d_channels_last(x, w7, b7, d, snake_terms=(a, inv))
            want = conv1d_channels_last(h, w1, b1, 1, residual=res).double()
            got = residual_unit_channels_last(x, w7, b7, d, (a, inv), w1, b1, res)
            assert got.shape == want.shape and got.dtype == dtype
            scale = h.double().abs() @ w1[0].double().abs().T + res.double().abs() + 1.0
            tol = 1e-5 if dtype == torch.float32 else 2.0 ** -6
            err = (got.double() - want).abs()
            assert (err <= tol * scale).all(), (dtype, (b, t, c, d), (err / scale).max().item())
            assert want.abs().max() > 0.1


def test_subpixel_weight_makes_the_transposed_convolution():
    """codec_waveform_cl.subpixel_weight, checked with torch's own convolutions (no kernel): a valid two-tap conv
    over [x[t-1], x[t]] with the packed weight and tiled bias, its [T, s * Cout] rows read as [T * s, Cout], is the
    causal transposed conv (kernel 2s, stride s, the last s samples dropped); other kernel sizes are refused."""
    from voxflow.models.qwen3_tts.codec_waveform_cl import subpixel_weight
    g = torch.Generator().manual_seed(7)
    for cin, cout, s in ((6, 5, 3), (8, 4, 2), (4, 3, 5)):
        x = torch.randn(2, cin, 9, generator=g, dtype=torch.float64)
        w = torch.randn(cin, cout, 2 * s, generator=g, dtype=torch.float64)
        b = torch.randn(cout, generator=g, dtype=torch.float64)
        want = F.conv_transpose1d(x, w, b, stride=s)[..., : 9 * s]                   # [B, Cout, T * s]
        packed, tiled = subpixel_weight(w, b, s)
        assert packed.shape == (2, s * cout, cin) and tiled.shape == (s * cout,)
        rows = F.conv1d(F.pad(x, (1, 0)), packed.permute(1, 2, 0), tiled)           # [B, s * Cout, T]
        got = rows.transpose(1, 2).reshape(2, 9 * s, cout).transpose(1, 2)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="2 \\* stride"):
        subpixel_weight(torch.randn(4, 3, 5), None, 3)


STACK_RUNS = 5      # check_waveform_stack_streams_like_the_plain_decoder's: one pass, two streamed calls twice


def check_waveform_stack_streams_like_the_plain_decoder():
    """A small decoder with the real rates (1920 samples a frame) and random weights: the channels-last stack,
    streamed a frame at a time, equals the plain decoder's one pass; without state, its one pass too. Streamed
    again through StateWriters (as the codec pool's step runs it): the same bits, every state entry of the form
    in use written into its slot."""
    from test_codec_decoder import random_decoder               # tests/test_codec_decoder.py
    from voxflow.kernels import causal_conv
    from voxflow.models.qwen3_tts import codec_waveform_cl
    from voxflow.models.qwen3_tts.codec_decoder_blocks import CausalConvTranspose1d, StateWriter
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state
    launch_config = causal_conv.launch_config
    dec = random_decoder(seed=3).requires_grad_(False)
    codes = torch.randint(0, 2048, (1, 16, 2), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = dec(codes)                                        # plain path (CPU)
        # The decoder's own forward, its waveform stack taken as on a GPU (the layers before it keep their plain
        # path: only this module's switch is forced); the stack must then actually run.
        stack, use_kernels, calls = codec_waveform_cl.waveform_stack, codec_waveform_cl.use_kernels, []
        codec_waveform_cl.use_kernels = lambda t: True
        codec_waveform_cl.waveform_stack = lambda *a: calls.append(1) or stack(*a)
        # Tiles of 512 rows, not 128: the interpreter's cost is per program (half the time here), and a frame's
        # 1920 rows still span several tiles (check_conv_against_torch holds the default tiles).
        causal_conv.launch_config = lambda *a: {**launch_config(*a), "BLOCK_T": 512}
        try:
            one_pass = dec(codes)
            state = init_stream_state(dec, 1).tensors
            pieces = [dec(codes[..., a:e], state) for a, e in ((0, 1), (1, 2))]
            carried, written, written_pieces = init_stream_state(dec, 1).tensors, [], []
            for a, e in ((0, 1), (1, 2)):
                garbage = {k: torch.full_like(v, float("nan") if v.is_floating_point() else -1)
                           for k, v in carried.items()}
                writer = StateWriter(carried, garbage)
                written_pieces.append(dec(codes[..., a:e], writer))
                written.append(writer.written)
                carried = {k: writer.slots[k] if k in writer.written else carried[k] for k in carried}
        finally:
            codec_waveform_cl.waveform_stack, codec_waveform_cl.use_kernels = stack, use_kernels
            causal_conv.launch_config = launch_config
    assert len(calls) == STACK_RUNS
    ups = [m for m in dec.modules() if isinstance(m, CausalConvTranspose1d) and m.subpixel and m.overlap]
    other_form = {m.state_key if codec_waveform_cl.SUBPIXEL else m.x_state_key for m in ups}
    assert ups and written == [set(state) - other_form] * 2
    assert all(torch.equal(a, b) for a, b in zip(written_pieces, pieces))
    assert all(torch.equal(carried[k], state[k]) for k in written[0])
    streamed = torch.cat(pieces, dim=-1)
    assert want.shape == one_pass.shape == streamed.shape == (1, 1, 2 * 1920)
    assert want.std() > 0.05
    torch.testing.assert_close(one_pass, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(streamed, want, rtol=0, atol=1e-4)


def check_residual_unit_tma_equals_the_two_kernels():
    """residual_unit_tma.py's fused fp16 unit against the two TMA convolutions it replaces (k=7 + SnakeBeta, then
    1x1 + bias + residual, with and without the next SnakeBeta and the raw value, written into a buffer's rows after
    a context): at 96 and 192 channels, dilations 1 / 3 / 9, rows not a multiple of the 128-row tile. Only the 1x1
    product's summation order differs: a value may land one fp16 rounding step away (one ulp of the output, or of h
    carried through the 1x1 weight), rarely (under 1% of the values)."""
    from voxflow.kernels import residual_unit_tma as residual_unit_tma_module
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    from voxflow.kernels.residual_unit_tma import residual_unit_tma
    g = torch.Generator().manual_seed(6)
    dtype = torch.float16
    for b, t, c, d in ((2, 130, 96, 3), (1, 70, 192, 9), (3, 20, 96, 1), (1, 300, 192, 1)):
        x = torch.randn(b, t + 6 * d, c, generator=g).to(dtype)
        w7 = pack_weight((torch.randn(c, c, 7, generator=g) / (7 * c) ** 0.5).to(dtype))
        w1 = pack_weight((torch.randn(c, c, 1, generator=g) / c ** 0.5).to(dtype))
        b7, b1 = (torch.randn(c, generator=g) * 0.1).to(dtype), (torch.randn(c, generator=g) * 0.1).to(dtype)
        a, inv, a2, inv2 = ((torch.rand(c, generator=g) + 0.5).to(dtype) for _ in range(4))
        res = torch.randn(b, t, c, generator=g).to(dtype)
        h = conv1d_channels_last(x, w7, b7, d, snake_terms=(a, inv), tma=True)
        ulp_h = (h.double().abs() @ w1[0].double().abs().T) * 2.0 ** -10     # one h rounding through the 1x1
        for activation in (None, (a2, inv2)):
            want_buf, got_buf = (torch.full((b, t + 5, c), -7.0).to(dtype) for _ in range(2))
            want_raw, got_raw = ((torch.empty(b, t, c, dtype=dtype) if activation else None) for _ in range(2))
            conv1d_channels_last(h, w1, b1, 1, residual=res, tma=True, activation=activation,
                                 out=want_buf[:, 5:], raw_out=want_raw)
            got = residual_unit_tma(x, w7, b7, d, (a, inv), w1, b1, res, activation=activation,
                                    out=got_buf[:, 5:], raw_out=got_raw)
            assert got.data_ptr() == got_buf[:, 5:].data_ptr() and (got_buf[:, :5] == -7).all()
            for name, g_, w_ in (("out", got_buf, want_buf), ("raw", got_raw, want_raw)):
                if w_ is None:
                    continue
                err = (g_.double() - w_.double()).abs()[:, -t:]
                bound = 2 * w_.double().abs()[:, -t:] * 2.0 ** -10 + 2 * ulp_h + 1e-6
                assert (err <= bound).all(), ((b, t, c, d), name, activation is not None, err.max().item())
                assert (err > 0).double().mean() < 0.01, ((b, t, c, d), name, (err > 0).double().mean().item())
            assert want_buf.abs().max() > 1.0
    # other tiles (the probe's sweep): the same values up to the k=7 sum's order (K blocks of 32, not 64)
    tiles = dict(BLOCK_T=64, BLOCK_N=128, BLOCK_N2=64, BLOCK_K=32, num_warps=4, num_stages=2)
    torch.testing.assert_close(residual_unit_tma(x, w7, b7, d, (a, inv), w1, b1, res, config=tiles).float(),
                               residual_unit_tma(x, w7, b7, d, (a, inv), w1, b1, res).float(), rtol=2 ** -9,
                               atol=2 ** -9)
    with pytest.raises(ValueError, match="BLOCK_N2 must be"):
        residual_unit_tma(x, w7, b7, d, (a, inv), w1, b1, res, config={**tiles, "BLOCK_N2": 32})
    with pytest.raises(ValueError, match="channels only"):
        residual_unit_tma(x[..., :64].contiguous(), w7, b7, d, (a, inv), w1, b1, res)
    with pytest.raises(ValueError, match="unit channel stride"):
        residual_unit_tma(x.transpose(1, 2).contiguous().transpose(1, 2), w7, b7, d, (a, inv), w1, b1, res)
    with pytest.raises(ValueError, match="needs one"):
        residual_unit_tma(x, w7, b7, d, (a, inv), w1, b1, res, raw_out=torch.empty_like(res))
    # 96 channels in K blocks of 64 or 128 (the probe's sweep): TMA fills the channels past 96 with zeros, in x and
    # in the weights, so the sums are the same up to their order
    c, d = 96, 3
    x = torch.randn(2, 130 + 6 * d, c, generator=g).to(dtype)
    w7 = pack_weight((torch.randn(c, c, 7, generator=g) / (7 * c) ** 0.5).to(dtype))
    w1 = pack_weight((torch.randn(c, c, 1, generator=g) / c ** 0.5).to(dtype))
    res96 = torch.randn(2, 130, c, generator=g).to(dtype)
    args = (x, w7, b7[:c], d, (a[:c], inv[:c]), w1, b1[:c], res96)
    want = residual_unit_tma(*args).float()
    for bk in (64, 128):
        got = residual_unit_tma(*args, config={**residual_unit_tma_module.CONFIGS[c], "BLOCK_K": bk}).float()
        torch.testing.assert_close(got, want, rtol=2 ** -9, atol=2 ** -9)


def check_stack_units_take_the_fused_tma_kernel():
    """codec_waveform_cl._residual_unit with residual_unit_tma on: a 96-channel fp16 unit (the stack's last level)
    runs as the one fused kernel, its output and the next unit's buffer the two-kernel path's (within the rounding
    bound of check_residual_unit_tma_equals_the_two_kernels); off, or at 64 channels, the two kernels run."""
    from voxflow.kernels import residual_unit_tma
    from voxflow.models.qwen3_tts import codec_waveform_cl as cl
    from voxflow.models.qwen3_tts.codec_decoder_blocks import ResidualUnit
    torch.manual_seed(7)
    calls = []
    real = residual_unit_tma.residual_unit_tma
    residual_unit_tma.residual_unit_tma = lambda *a, **k: calls.append(1) or real(*a, **k)
    enabled = residual_unit_tma.ENABLED
    try:
        for c, fused in ((96, True), (64, False)):
            unit, after = ResidualUnit(c, 3), ResidualUnit(c, 9)
            for m in (unit, after):
                for p in m.parameters():
                    p.data = torch.randn_like(p) * (0.3 if p.dim() == 1 else 1 / p.shape[1] ** 0.5 / 2)
            unit, after = unit.half().requires_grad_(False), after.half().requires_grad_(False)
            x = torch.randn(2, 250, c).half()        # (2 tiles a sequence: the TMA rule takes it)
            buf = cl._activated(cl._unit_input(unit), x, None)
            for keep in (True, False):              # a unit before another keeps its output (the residual)
                outs = {}
                for on in (False, True):
                    residual_unit_tma.ENABLED = on
                    ran = len(calls)
                    outs[on] = cl._residual_unit(unit, x, buf, cl._unit_input(after), keep, None)
                    assert len(calls) - ran == (1 if on and fused else 0), (c, on)
                assert (outs[True][0] is None) == (outs[False][0] is None) == (not keep)
                for got, want in zip(outs[True], outs[False]):
                    if want is not None:
                        assert got.shape == want.shape
                        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -9, atol=2 ** -9)
    finally:
        residual_unit_tma.residual_unit_tma, residual_unit_tma.ENABLED = real, enabled


def check_context_exchange_equals_the_two_copies():
    """kernels/context_exchange.py: the buffer's first ctx rows get the carried context (transposed) and the next
    context gets the buffer's last ctx rows - for calls shorter than the context too, where part of it is the old
    context's - the same bits as the two copies it replaces; the next context also into a strided slot (the codec
    pool's write-back rows), nothing written between its pieces; overlapping memory refused."""
    from voxflow.kernels.context_exchange import exchange_context
    g = torch.Generator().manual_seed(8)
    for dtype in (torch.float32, torch.float16):
        for ctx, t, c in ((6, 1, 24), (54, 20, 40), (54, 54, 8), (3, 100, 130)):
            old = torch.randn(2, c, ctx, generator=g).to(dtype)
            buf = torch.full((2, ctx + t, c), float("nan")).to(dtype)
            buf[:, ctx:] = torch.randn(2, t, c, generator=g).to(dtype)
            want_buf = buf.clone()
            want_buf[:, :ctx] = old.transpose(1, 2)
            want_new = want_buf[:, t:].transpose(1, 2)
            rows = torch.full((2, 2 * c * ctx + 3), -5.0).to(dtype)
            new = rows[:, 3:3 + c * ctx].view(2, c, ctx)
            exchange_context(buf, old, new)
            assert torch.equal(buf, want_buf) and torch.equal(new, want_new), (ctx, t, c)
            assert (rows[:, :3] == -5).all() and (rows[:, 3 + c * ctx:] == -5).all()
    with pytest.raises(ValueError, match="share memory"):
        exchange_context(buf, old, old)


if IN_CHILD:
    def test_child_context_exchange():
        check_context_exchange_equals_the_two_copies()

    def test_child_waveform_stack_with_context_copies(monkeypatch):
        """codec_waveform_cl.CONTEXT_KERNEL off: the contexts in and out by two copies each, no exchange launch; the
        same audio (on, the default: test_child_waveform_stack)."""
        from voxflow.kernels import context_exchange
        from voxflow.models.qwen3_tts import codec_waveform_cl
        calls = []
        real = context_exchange.exchange_context
        monkeypatch.setattr(context_exchange, "exchange_context", lambda *a: calls.append(1) or real(*a))
        monkeypatch.setattr(codec_waveform_cl, "CONTEXT_KERNEL", False)
        check_waveform_stack_streams_like_the_plain_decoder()
        assert not calls

    def test_child_conv_against_torch():
        check_conv_against_torch()

    def test_child_snake_channels_last():
        check_snake_channels_last()

    def test_child_overlap_add():
        check_overlap_add()

    def test_child_activation_in_the_epilogue():
        check_activation_in_the_epilogue()

    def test_child_flat_tma_tiles():
        check_flat_tma_tiles_equal_the_pointer_kernel()

    def test_child_split_n_equals_one_tile():
        check_split_n_equals_one_tile()

    def test_child_waveform_stack(monkeypatch):
        """The default stack (set here whatever the environment says): streamed and one-pass, the plain decoder's
        audio, with
        - the upsampling blocks' transposed convolutions as two-tap sub-pixel convolutions (SUBPIXEL), carrying the
          last input row between calls: every upsampling block of each stack run;
        - every unit's SnakeBeta applied by the kernel before it (ACT_IN_EPILOGUE 2): 17 - 16 passes a stack run
          (the first block's remains);
        - one context exchange launch for each streamed convolution with a context (CONTEXT_KERNEL: 3 units x 4
          blocks + the output convolution, + the 4 sub-pixel convolutions' one row)."""
        from voxflow.kernels import causal_conv, context_exchange
        from voxflow.models.qwen3_tts import codec_waveform_cl
        monkeypatch.setattr(codec_waveform_cl, "SUBPIXEL", True)
        monkeypatch.setattr(codec_waveform_cl, "ACT_IN_EPILOGUE", 2)
        monkeypatch.setattr(codec_waveform_cl, "CONTEXT_KERNEL", True)
        spied = {"subpixel": [], "snake": [], "exchange": []}
        for mod, name, key in ((codec_waveform_cl, "_conv_transpose_subpixel", "subpixel"),
                               (causal_conv, "snake_channels_last", "snake"),
                               (context_exchange, "exchange_context", "exchange")):
            monkeypatch.setattr(mod, name, lambda *a, _real=getattr(mod, name), _key=key, **k: (
                spied[_key].append(1) or _real(*a, **k)))
        check_waveform_stack_streams_like_the_plain_decoder()
        streamed_runs = STACK_RUNS - 1                          # all but the one pass without a state
        assert {k: len(v) for k, v in spied.items()} == {"subpixel": STACK_RUNS * 4, "snake": STACK_RUNS,
                                                         "exchange": streamed_runs * (13 + 4)}

    @pytest.mark.parametrize("on", [True, False])
    def test_child_waveform_stack_with_and_without_the_one_channel_kernel(monkeypatch, on):
        """codec_waveform_cl.ONE_CHANNEL_KERNEL (on by default): the last convolution on its own kernel once a stack
        run, or (off) on the implicit GEMM; the plain decoder's audio either way, streamed and one-pass."""
        from voxflow.kernels import one_channel_conv_cl
        from voxflow.models.qwen3_tts import codec_waveform_cl
        monkeypatch.setattr(codec_waveform_cl, "ONE_CHANNEL_KERNEL", on)
        calls = []
        real = one_channel_conv_cl.conv1d_to_one_channel
        monkeypatch.setattr(one_channel_conv_cl, "conv1d_to_one_channel", lambda *a: calls.append(1) or real(*a))
        check_waveform_stack_streams_like_the_plain_decoder()
        assert len(calls) == (STACK_RUNS if on else 0)

    def test_child_waveform_stack_with_the_first_conv_channels_last(monkeypatch):
        """codec_waveform_cl.FIRST_CONV_CL: the first convolution channels-last on the TMA kernel (its tiles across
        sequences, the first block's SnakeBeta in its epilogue) once a stack run, here with TMA taken for every
        convolution the interpreter's descriptors allow; the plain decoder's audio, streamed and one-pass."""
        from voxflow.kernels import causal_conv
        from voxflow.models.qwen3_tts import codec_waveform_cl
        monkeypatch.setattr(codec_waveform_cl, "FIRST_CONV_CL", True)
        monkeypatch.setattr(causal_conv, "CONV_TMA_FLAT", True)
        monkeypatch.setattr(causal_conv, "tma_by_default", lambda *a: True)        # as on a Hopper GPU in fp16
        taken = []
        real = causal_conv.takes_tma
        monkeypatch.setattr(causal_conv, "takes_tma", lambda *a: taken.append(real(*a)) or taken[-1])
        check_waveform_stack_streams_like_the_plain_decoder()
        assert taken == [True] * STACK_RUNS

    def test_child_residual_unit():
        check_residual_unit_equals_the_two_kernels()

    def test_child_residual_unit_tma():
        check_residual_unit_tma_equals_the_two_kernels()

    def test_child_stack_units_take_the_fused_tma_kernel():
        check_stack_units_take_the_fused_tma_kernel()

    @pytest.mark.parametrize("level, subpixel, passes", [(0, False, 17), (1, False, 13), (2, False, 1)])
    def test_child_waveform_stack_with_activations_in_epilogues(monkeypatch, level, subpixel, passes):
        """codec_waveform_cl.ACT_IN_EPILOGUE: the SnakeBeta starting the next block (1), and every unit (2), applied
        by the kernel before it; streamed and one-pass, the plain decoder's audio, with 17 - 4 (1) or 17 - 16 (2)
        SnakeBeta passes a stack run (the first block's remains), with the plain transposed convolutions (level 2
        with the sub-pixel ones is the default: test_child_waveform_stack)."""
        from voxflow.kernels import causal_conv
        from voxflow.models.qwen3_tts import codec_waveform_cl
        monkeypatch.setattr(codec_waveform_cl, "ACT_IN_EPILOGUE", level)
        monkeypatch.setattr(codec_waveform_cl, "SUBPIXEL", subpixel)
        snake_passes = []
        snake = causal_conv.snake_channels_last
        monkeypatch.setattr(causal_conv, "snake_channels_last",
                            lambda *a, **k: snake_passes.append(1) or snake(*a, **k))
        check_waveform_stack_streams_like_the_plain_decoder()
        assert len(snake_passes) == STACK_RUNS * passes

    def test_child_waveform_stack_with_fused_residual_units(monkeypatch):
        from voxflow.kernels import residual_unit
        monkeypatch.setattr(residual_unit, "ENABLED", True)
        check_waveform_stack_streams_like_the_plain_decoder()
else:
    def test_channels_last_codec_kernels_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)

    def test_tma_needs_an_nvidia_device_of_capability_9(monkeypatch):
        """_has_tma, the device gate of tma_fits for CUDA tensors: capability 8 -> no, 9 (Hopper) and 10 -> yes; a
        ROCm build (torch.version.hip set) -> no, whatever capability it reports."""
        from voxflow.kernels import causal_conv
        device = torch.device("cuda", 0)                   # an index given: no device is asked which is current
        monkeypatch.setattr(torch.version, "hip", None)
        for major, want in ((8, False), (9, True), (10, True)):
            monkeypatch.setattr(causal_conv, "_major_capability", lambda index, m=major: m)
            assert causal_conv._has_tma(device) is want, major
        monkeypatch.setattr(torch.version, "hip", "6.2.41133")
        assert causal_conv._has_tma(device) is False          # (the capability still patched to 10)

    def test_tma_default_is_fp16_cuda_only(monkeypatch):
        """tma_by_default, conv1d_channels_last's choice for tma=None: CONV_TMA for fp16 on CUDA; bf16 / fp32 (only
        fp16 was measured faster) and CPU tensors keep the pointer kernel; VOXFLOW_CONV_TMA=0 (CONV_TMA off): none."""
        from voxflow.kernels import causal_conv
        monkeypatch.setattr(causal_conv, "CONV_TMA", True)
        assert causal_conv.tma_by_default(True, torch.float16) is True
        for is_cuda, dtype in ((True, torch.bfloat16), (True, torch.float32), (False, torch.float16)):
            assert causal_conv.tma_by_default(is_cuda, dtype) is False, (is_cuda, dtype)
        monkeypatch.setattr(causal_conv, "CONV_TMA", False)
        assert causal_conv.tma_by_default(True, torch.float16) is False

    def test_channels_last_stack_is_not_taken_for_autograd(monkeypatch):
        """The Triton kernels have no backward: with a graph to record, the decoder keeps the plain path."""
        from voxflow.models.qwen3_tts import codec_waveform_cl
        monkeypatch.setattr(codec_waveform_cl, "use_kernels", lambda t: True)     # as on CUDA
        x = torch.randn(1, 8, 5)
        assert codec_waveform_cl.supported(x)
        with torch.enable_grad():
            assert not codec_waveform_cl.supported(x.requires_grad_())
        monkeypatch.setattr(codec_waveform_cl, "ENABLED", False)
        assert not codec_waveform_cl.supported(x.detach())
