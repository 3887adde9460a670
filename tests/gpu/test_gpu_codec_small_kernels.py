"""The codec's small Triton kernels on the GPU: the pool's row gather / scatter (voxflow/kernels/row_copy.py)
bit-equal to index_select / index_copy_ at the codec's real width (1,307,616 fp16 values a row), rows repeated and
in any order, and a stride-0 source (a reset); the residual dequantisation (rvq_lookup.py) equal to the lookups and
adds it replaces; the attention's key / value window (kv_window.py) equal to the concatenations it replaces; the
window attention (window_attention.py) against PyTorch's masked attention."""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from voxflow.kernels.row_copy import gather_rows, scatter_rows  # noqa: E402


@pytest.mark.parametrize("dtype, width", [(torch.float16, 1_307_616), (torch.int64, 1), (torch.float32, 4097)])
def test_row_copies_equal_the_index_ops(dtype, width):
    g = torch.Generator("cuda").manual_seed(0)
    buf = (torch.randn(17, width, device="cuda", generator=g) * 100).to(dtype)
    rows = torch.tensor([16, 3, 0, 16, 9], device="cuda")
    assert torch.equal(gather_rows(buf, rows), buf.index_select(0, rows))
    distinct = torch.tensor([5, 0, 12], device="cuda")
    src = (torch.randn(3, width, device="cuda", generator=g) * 100).to(dtype)
    want = buf.clone().index_copy_(0, distinct, src)
    scatter_rows(buf, distinct, src)
    assert torch.equal(buf, want)
    scatter_rows(buf, torch.tensor([1, 2], device="cuda"), src[:1].expand(2, -1))
    assert torch.equal(buf[1], src[0]) and torch.equal(buf[2], src[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rvq_lookup_equals_the_lookups_and_adds(dtype):
    """kernels/rvq_lookup.py at the 12 Hz codec's acoustic codebooks (15 x 2048 x 256), a 16-stream 25-frame call's
    codes sliced as the split dequantiser slices them: the reference's bits."""
    import torch.nn.functional as F
    from voxflow.kernels.rvq_lookup import rvq_lookup
    g = torch.Generator("cuda").manual_seed(1)
    table = torch.randn(15, 2048, 256, device="cuda", generator=g).to(dtype)
    codes = torch.randint(0, 2048, (16, 16, 25), device="cuda", generator=g)[:, 1:]
    want = 0
    for k in range(15):
        want = want + F.embedding(codes[:, k], table[k])
    assert torch.equal(rvq_lookup(codes, table), want)


@pytest.mark.parametrize("frames", [1, 25, 80])
def test_kv_window_equals_the_concatenations(frames):
    """kernels/kv_window.py at the codec attention's shapes (16 streams, 16 heads of 64, a 71-frame window), the new
    rows as the rotary kernel leaves them (a transposed view): the concatenations' and clones' values."""
    from voxflow.kernels.kv_window import kv_window
    g = torch.Generator("cuda").manual_seed(2)
    k_cache, v_cache = (torch.randn(16, 16, 71, 64, device="cuda", generator=g).half() for _ in range(2))
    k_new = torch.randn(16, frames, 16, 64, device="cuda", generator=g).half().transpose(1, 2)
    v_new = torch.randn(16, 16, frames, 64, device="cuda", generator=g).half()
    k_all, v_all = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    got = kv_window(k_cache, v_cache, k_new, v_new)
    for a, b in zip(got, (k_all, v_all, k_all[:, :, frames:], v_all[:, :, frames:])):
        assert torch.equal(a, b)
    # the carried rows into a pool-like packed buffer's pieces (row stride past the piece: StateWriter's slots)
    n = k_cache[0].numel()
    rows = torch.zeros(16, 2 * n + 8, device="cuda", dtype=torch.half)
    slots = tuple(rows[:, o:o + n].view(k_cache.shape) for o in (0, n + 8))
    kv_window(k_cache, v_cache, k_new, v_new, keep_out=slots)
    assert torch.equal(slots[0], got[2]) and torch.equal(slots[1], got[3]) and not rows[:, n:n + 8].any()


@pytest.mark.parametrize("frames", [1, 25, 80])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_window_attention_equals_the_masked_attention(frames, dtype, tol):
    """kernels/window_attention.py at the codec's shapes (16 streams at different points - the first call, young,
    old - 16 heads of 64, a 72-frame window): PyTorch's attention over the concatenated window with the codec's
    boolean mask, fp32 within 1e-5 (IEEE products), fp16 within its rounding (relative to the output's scale)."""
    import torch.nn.functional as F
    from voxflow.kernels.window_attention import window_attention
    g = torch.Generator("cuda").manual_seed(3)
    start = torch.tensor([0, 1, 30, 70, 71, 72, 500] + [9] * 9, device="cuda")
    q = torch.randn(16, frames, 16, 64, device="cuda", generator=g).to(dtype).transpose(1, 2)
    k_cache, v_cache = (torch.randn(16, 16, 71, 64, device="cuda", generator=g).to(dtype) for _ in range(2))
    k_new, v_new = (torch.randn(16, frames, 16, 64, device="cuda", generator=g).to(dtype).transpose(1, 2)
                    for _ in range(2))
    k, v = torch.cat([k_cache, k_new], dim=2).float(), torch.cat([v_cache, v_new], dim=2).float()
    q_pos = start[:, None] + torch.arange(frames, device="cuda")
    k_pos = start[:, None] + torch.arange(-71, frames, device="cuda")
    delta = q_pos[:, :, None] - k_pos[:, None, :]
    mask = ((delta >= 0) & (delta < 72) & (k_pos >= 0)[:, None, :])[:, None]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):                                # fp32 throughout, no TF32
        want = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask, scale=0.125)
    want = want.transpose(1, 2).reshape(16, frames, 1024)
    got = window_attention(q, k_cache, v_cache, k_new, v_new, start, 0.125)
    assert got.dtype == dtype and (got.float() - want).abs().max() <= tol * want.abs().max()


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.float16, 2 ** -11), (torch.bfloat16, 2 ** -8)])
def test_rope_table_equals_the_frame_transformers(dtype, atol):
    """kernels/rope_table.py at the codec's shapes (16 streams, head size 64, young and old streams, 1 / 25
    frames): FrameTransformer.rope's tables within one unit in the last place of values in [-1, 1] (the device's cos
    and sin against PyTorch's kernels: the same products), the next positions exact; the fraction of equal values
    printed."""
    from voxflow.kernels.rope_table import rope_table
    from voxflow.models.qwen3_tts.codec_decoder import FrameTransformer
    from voxflow.models.qwen3_tts.config import CodecDecoderConfig
    tr = FrameTransformer(CodecDecoderConfig()).to("cuda", dtype)
    start = torch.tensor([0, 1, 71, 72, 5000, 123_456] + [9] * 10, device="cuda")
    for t in (1, 25):
        want = tr.rope(start[:, None] + torch.arange(t, device="cuda"), dtype)
        nxt = torch.empty_like(start)
        got = rope_table(start, t, tr.inv_freq, dtype, nxt)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=atol)
            print(f"{dtype} T={t}: {(a == b).float().mean().item():.4f} of the values equal")
        assert torch.equal(nxt, start + t)


@pytest.mark.parametrize("ctx, frames", [(54, 1), (54, 25), (6, 25)])
def test_context_exchange_equals_the_two_copies(ctx, frames):
    """kernels/context_exchange.py at a codec block's width (16 streams, 768 channels, a 1-frame call's 8 rows a
    frame or 25 frames' 200): the buffer's head and the next context the same bits as the two copies, the next
    context into a strided slot of a packed buffer."""
    from voxflow.kernels.context_exchange import exchange_context
    g = torch.Generator("cuda").manual_seed(4)
    t = 8 * frames
    old = torch.randn(16, 768, ctx, device="cuda", generator=g).half()
    buf = torch.randn(16, ctx + t, 768, device="cuda", generator=g).half()
    want_buf = buf.clone()
    want_buf[:, :ctx] = old.transpose(1, 2)
    rows = torch.zeros(16, 768 * ctx + 64, device="cuda", dtype=torch.half)
    new = rows[:, 64:].view(16, 768, ctx)
    exchange_context(buf, old, new)
    assert torch.equal(buf, want_buf) and torch.equal(new, want_buf[:, t:].transpose(1, 2))
    assert not rows[:, :64].any()



@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("launch", [None, (64, 2), (256, 8), (512, 8)])
def test_one_channel_conv_equals_conv1d(dtype, launch):
    """kernels/one_channel_conv_cl.py at the codec's last layer (96 -> 1 channel, k=7; 3 streams x 2 frames' 3,840
    samples, in the rows of a buffer after the 6-row left context) against conv1d in float64 on the same inputs:
    fp16 within an ulp of each of its two roundings (the convolution, + bias) plus 1e-6 of the sum of |terms|; fp32
    (exact fp32 products, no TF32) within 1e-5 of it. And against the implicit-GEMM kernel it replaces: fp16
    within an ulp of each rounding (their fp32 sums differ in order only)."""
    import torch.nn.functional as F
    from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
    from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
    g = torch.Generator("cuda").manual_seed(7)
    t = 2 * 1920
    x = torch.randn(3, 6 + t, 96, device="cuda", generator=g).to(dtype)
    w = (torch.randn(1, 96, 7, device="cuda", generator=g) / 26).to(dtype)
    bias = (torch.randn(1, device="cuda", generator=g) * 0.1).to(dtype)
    got = conv1d_to_one_channel(x, pack_weight(w), bias, launch=launch)
    x64 = x.transpose(1, 2).double()
    exact = F.conv1d(x64, w.double())
    scale = F.conv1d(x64.abs(), w.double().abs())
    if dtype == torch.float32:
        want, bound = exact + bias.double(), 1e-5 * (scale + 1)
    else:
        want = (exact.to(dtype).double() + bias.double()).to(dtype).double()
        bound = 2 ** -10 * (exact.abs() + want.abs()) + 1e-6 * scale
    err = (got.transpose(1, 2).double() - want).abs()
    assert (err <= bound).all(), (err / bound).max().item()
    if dtype == torch.float16:
        gemm = conv1d_channels_last(x, pack_weight(w), bias).double()
        near = 2 ** -10 * (gemm.abs() + exact.transpose(1, 2).abs()) + 1e-6 * scale.transpose(1, 2)
        assert ((got.double() - gemm).abs() <= near).all()
