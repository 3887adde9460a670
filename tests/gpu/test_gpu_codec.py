"""The codec runner on the GPU at the REAL codec size (random weights): CUDA graphs, the codec stream, bf16.

Run on the device machine: `python -m pytest tests/gpu/test_gpu_codec.py -q`; skipped where there is no CUDA.

The decoder is the real-size one (1536-wide, 8 layers) with the deterministic random weights of
`voxflow.tools.real_size_checkpoint` — generated here for the codec alone (the same per-key generator, a few
seconds), or read from VOXFLOW_REAL_DIR when that names a checkpoint the tool wrote. One per test module.

Tolerances (fp32, TF32 off): the graph path must equal the eager path to 1e-4 (same kernels, same shapes;
only reduction order inside a kernel may differ), and both the one-pass decode to 1e-4 (streaming is exact
up to rounding, spec 7.3). bf16: see test_bf16_streaming_snr_against_fp32_one_pass.
"""
import os

import numpy as np
import pytest
import torch

from voxflow.engine.sm_partition import auto_sms
from voxflow.models.qwen3_tts.codec_decoder import CodecDecoder
from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
from voxflow.tools.codec_snr import cast_decoder, load_codec_decoder, measure, random_real_codec_decoder, snr_db

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
UP = 1920
TOL = 1e-4
# bf16 streamed through the runner vs the fp32 one pass, real size, random weights, seed 0: measured 28.3 dB on
# CPU over 30 frames and 28.2 dB on an H200 over these 150 frames (graphs on). bf16 keeps 8 mantissa bits
# (~2^-9 relative rounding per op) and the error adds up over the decoder's many layers: ~28 dB is the expected
# level, not a bug. The threshold leaves 8 dB for other kernels / library versions and other codes; a bf16 path
# that broke something (a state kept in the wrong dtype, wrong RoPE positions, a padded row leaking into a live
# one) lands near 0 dB, far below it.
BF16_MIN_SNR_DB = 20.0


@pytest.fixture(scope="module")
def dec() -> CodecDecoder:
    real_dir = os.environ.get("VOXFLOW_REAL_DIR")
    if real_dir:
        return load_codec_decoder(real_dir, "cuda")
    return random_real_codec_decoder("cuda")


def codes_for(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def one_pass(dec, codes: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return dec(codes.T[None].cuda())[0, 0].float().cpu().numpy()


# request -> (prefix frames, chunk sizes); the last chunk is final. At the second call a, b, c share 25-frame
# pieces (3 padded to the bucket of 4); d starts after a is released, in a's row.
PLAN = {"a": (0, [1, 25, 12]), "b": (0, [1, 25, 25, 7]), "c": (9, [2, 25, 3]), "d": (0, [5, 25, 20])}


def run_plan(runner: Qwen3CodecRunner) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """PLAN through the runner -> (PCM per request, codes per request)."""
    codes = {k: codes_for(9 + sum(sizes), seed=i) for i, (k, (_, sizes)) in enumerate(PLAN.items())}
    states, step, done, pcm = {}, {k: 0 for k in PLAN}, {}, {k: [] for k in PLAN}
    order = ["a", "b", "c"]
    for call in range(6):
        if call == 3:
            runner.release(states.pop("a"))
            order.append("d")
        live = [k for k in order if k in PLAN and step[k] < len(PLAN[k][1])]
        for k in live:
            if k not in states:
                prefix = PLAN[k][0]
                states[k] = runner.new_state(codes[k][:prefix] if prefix else None)
                done[k] = prefix
        frames, final = [], []
        for k in live:
            n = PLAN[k][1][step[k]]
            frames.append(codes[k][done[k]: done[k] + n])
            final.append(step[k] == len(PLAN[k][1]) - 1)
        out, _ = runner.decode([states[k] for k in live], frames, final)
        for k, f, p in zip(live, frames, out):
            pcm[k].append(p)
            done[k] += f.shape[0]
            step[k] += 1
    assert "a" not in states and states["d"].row == 0 and all(step[k] == len(PLAN[k][1]) for k in PLAN)
    got = {k: np.concatenate(v) for k, v in pcm.items()}
    for k, (prefix, sizes) in PLAN.items():
        assert got[k].shape == (sum(sizes) * UP,)
    return got, codes


def test_graph_path_equals_eager_fp32(dec):
    graphed = Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True)
    eager = Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=False)
    g, codes = run_plan(graphed)
    e, _ = run_plan(eager)
    assert (4, 25) in graphed.graphs and (2, 1) in graphed.graphs and eager.graphs is None
    for k, (prefix, _) in PLAN.items():
        assert np.abs(g[k] - e[k]).max() <= TOL, k
        ref = one_pass(dec, codes[k][: prefix + g[k].shape[0] // UP])[prefix * UP:]
        assert np.abs(g[k] - ref).max() <= TOL, k
        assert ref.std() > 0.05                                  # not a silent comparison


def test_the_state_written_into_the_write_back_rows_gives_the_same_bits(dec, monkeypatch):
    """codec_pool.STATE_WRITER (the decode's new state straight into the packed write-back rows, the key / value
    window kernel storing there itself) against the cat that packed it before, and codec_waveform_cl.CONTEXT_KERNEL
    (the convolutions' contexts in and out in one launch) against the two copies, fp16 through the CUDA graphs: the
    same PCM bits for the whole plan (mixed batches, padded pieces, a reused row)."""
    from voxflow.models.qwen3_tts import codec_pool, codec_waveform_cl
    half = cast_decoder(dec, torch.float16)
    runs = {}
    for writer, context in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(codec_pool, "STATE_WRITER", writer)
        monkeypatch.setattr(codec_waveform_cl, "CONTEXT_KERNEL", context)
        runs[writer, context], _ = run_plan(Qwen3CodecRunner.from_decoder(half, max_rows=8, cuda_graphs=True))
    for k in PLAN:
        assert runs[True, True][k].std() > 0.05, k
        assert np.array_equal(runs[True, True][k], runs[False, True][k]), k
        assert np.array_equal(runs[True, True][k], runs[True, False][k]), k


def test_bf16_graph_path_is_close_to_bf16_eager(dec):
    low = cast_decoder(dec, torch.bfloat16)
    graphed = Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True)
    eager = Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=False)
    assert graphed.pool.state.tensors["pre_conv"].dtype == torch.bfloat16
    g, _ = run_plan(graphed)
    e, _ = run_plan(eager)
    for k in PLAN:
        # Same kernels on the same shapes: equal up to bf16 rounding of any reduction-order difference.
        assert snr_db(e[k], g[k]) > 40.0, k


def test_bf16_streaming_snr_against_fp32_one_pass(dec):
    result = measure(dec, torch.bfloat16, 150, seed=0)          # first chunk 1, then 25s, last one final
    assert result["cuda_graphs"] and result["device"].startswith("cuda")
    print(result)
    assert result["snr_db"] is not None and result["snr_db"] >= BF16_MIN_SNR_DB, result
    # and fp32 through the same path is the one pass (so the bf16 number measures bf16, not streaming)
    exact = measure(dec, torch.float32, 150, seed=0)
    assert exact["max_abs_err"] <= TOL, exact


# fp32 weights with TF32 convolutions and matmuls (the serving default: PyTorch's default for convolutions; the
# channels-last kernels and the GEMMs follow it) against plain fp32: TF32 keeps 10 mantissa bits to bf16's 7, so
# ~18 dB above bf16's ~28 dB is expected; 35 dB leaves room and still fails a path that lost precision elsewhere.
TF32_MIN_SNR_DB = 35.0


def test_tf32_streaming_snr_against_fp32_one_pass(dec):
    result = measure(dec, torch.float32, 150, seed=0, tf32=True)
    print(result)
    assert result["cuda_graphs"] and result["max_abs_err"] > 0          # TF32 did change the audio
    assert result["snr_db"] is not None and result["snr_db"] >= TF32_MIN_SNR_DB, result


# fp16 weights and activations (10 mantissa bits, like TF32's products, but every stored activation rounded too):
# 45.7 dB on CPU over 30 frames (bf16 there: 28.5 dB, as on the H200). 35 dB as TF32's threshold: still ~15 dB
# above bf16, so a path that fell back to bf16 precision somewhere (a bf16 config, a state kept in bf16) fails it.
FP16_MIN_SNR_DB = 35.0


def test_fp16_streaming_snr_against_fp32_one_pass(dec, monkeypatch):
    """fp16 streamed through the graphed runner (the channels-last Triton stack in fp16) against the fp32 one pass,
    with the TMA convolutions off (CONV_TMA, fp16's default on Hopper) so the pointer kernel's path stays covered;
    the TMA path: the test below."""
    from voxflow.kernels import causal_conv
    from voxflow.models.qwen3_tts import codec_waveform_cl
    monkeypatch.setattr(causal_conv, "CONV_TMA", False)
    calls = []
    stack = codec_waveform_cl.waveform_stack
    monkeypatch.setattr(codec_waveform_cl, "waveform_stack", lambda *a: calls.append(a[1].dtype) or stack(*a))
    result = measure(dec, torch.float16, 150, seed=0)
    print(result)
    assert torch.float16 in calls                  # the fast stack ran in fp16 (the fp32 reference's calls aside)
    assert result["cuda_graphs"] and result["snr_db"] is not None and result["snr_db"] >= FP16_MIN_SNR_DB, result


def _skip_without_tma() -> None:
    major, minor = torch.cuda.get_device_capability()
    if major < 9 or torch.version.hip is not None:
        pytest.skip(f"TMA descriptors need an NVIDIA GPU of compute capability >= 9 (Hopper); this one is "
                    f"{major}.{minor}" + (" under ROCm" if torch.version.hip is not None else ""))


def test_tma_convolutions_equal_the_pointer_kernel_and_keep_the_fp16_snr(dec, monkeypatch):
    """VOXFLOW_CONV_TMA's kernel (operand tiles through TMA descriptors, a tile per sequence): at the codec's
    high-rate shapes in fp16 (16 sequences x 25 frames' rows) within 2 fp16 ulps of the pointer kernel (the same
    products and sums in another tiling), and the whole fp16 stack streamed with it on keeps FP16_MIN_SNR_DB."""
    from voxflow.kernels import causal_conv
    _skip_without_tma()
    calls = []
    tma_kernel = causal_conv._conv_tma
    monkeypatch.setattr(causal_conv, "_conv_tma", lambda *a, **k: calls.append(1) or tma_kernel(*a, **k))
    g = torch.Generator("cuda").manual_seed(0)
    for n, (cin, k, dil) in enumerate(((96, 7, 9), (192, 7, 1), (768, 1, 1))):
        x = torch.randn(16, 2000 + (k - 1) * dil, cin, device="cuda", generator=g).half()
        w = causal_conv.pack_weight((torch.randn(cin, cin, k, device="cuda", generator=g) / (cin * k) ** 0.5).half())
        bias = torch.randn(cin, device="cuda", generator=g).half() * 0.1
        want = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=False)
        got = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=True)
        assert len(calls) == n + 1                                    # the TMA kernel ran
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * 2 ** -10, atol=1e-3)
    calls.clear()
    monkeypatch.setattr(causal_conv, "CONV_TMA", True)
    result = measure(dec, torch.float16, 150, seed=0)
    print(result, len(calls))
    assert calls and result["cuda_graphs"], result
    assert result["snr_db"] is not None and result["snr_db"] >= FP16_MIN_SNR_DB, result


def test_flat_tma_tiles_equal_the_pointer_kernel_and_keep_the_audio(dec, monkeypatch):
    """VOXFLOW_CONV_TMA_FLAT (tiles across a batch's sequences where they are too short for their own): at the
    low-rate shapes of a 16-stream 25-frame call that took the pointer kernel - the first upsampling convolution's
    sub-pixel form (1536 -> 8 x 768, two taps, 100 rows a sequence) and a 1-frame call's 768-channel 1x1 (32 rows) -
    within 2 fp16 ulps of the pointer kernel. Then several streams through the graphed fp16 runner (PLAN: 25-frame
    pieces of three streams share calls, where the flat tiles are taken), with the first convolution on them
    (VOXFLOW_CODEC_FIRST_CONV_CL) and the one-channel output kernel (VOXFLOW_CODEC_ONE_CHANNEL_KERNEL): >= 45 dB
    from the same runner with the three off (test_half_channels_last_stack_is_close_to_the_half_ncl_kernels's fp16
    bound) and no noisier against the fp32 decoder by more than 0.5 dB. (Session 55 on an H100: the one-stream
    150-frame stack with all three on kept 45.5 dB against the fp32 one pass.)"""
    from voxflow.kernels import causal_conv
    from voxflow.models.qwen3_tts import codec_waveform_cl
    _skip_without_tma()
    flat = []
    tma_kernel = causal_conv._conv_tma
    monkeypatch.setattr(causal_conv, "_conv_tma", lambda *a, **k: flat.append(k.get("flat")) or tma_kernel(*a, **k))
    monkeypatch.setattr(causal_conv, "CONV_TMA_FLAT", True)
    g = torch.Generator("cuda").manual_seed(2)
    for cin, cout, k, t, dil in ((1536, 6144, 2, 100, 1), (768, 768, 1, 32, 1)):
        x = torch.randn(16, t + (k - 1) * dil, cin, device="cuda", generator=g).half()
        w = causal_conv.pack_weight((torch.randn(cout, cin, k, device="cuda", generator=g) / (cin * k) ** 0.5).half())
        bias = torch.randn(cout, device="cuda", generator=g).half() * 0.1
        want = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=False)
        got = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=True)
        assert flat[-1] is True, (cin, cout, k)
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * 2 ** -10, atol=1e-3)
    reference, _ = run_plan(Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True))
    low = cast_decoder(dec, torch.float16)
    switches = ((causal_conv, "CONV_TMA_FLAT"), (codec_waveform_cl, "FIRST_CONV_CL"),
                (codec_waveform_cl, "ONE_CHANNEL_KERNEL"))
    for module, name in switches:
        monkeypatch.setattr(module, name, False)
    off, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    for module, name in switches:
        monkeypatch.setattr(module, name, True)
    flat.clear()
    on, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    print(flat.count(True), "flat launches of", len(flat))
    assert True in flat                                       # (counted while the graphs were captured)
    for k in PLAN:
        assert snr_db(off[k], on[k]) > 45.0, k
        assert snr_db(reference[k], on[k]) >= snr_db(reference[k], off[k]) - 0.5, k


def test_upsample_stages_over_rows_keep_the_audio(dec, monkeypatch):
    """VOXFLOW_CODEC_UPSAMPLE_CL (codec_upsample_cl.py, built in session 56): the ConvNeXt blocks' depthwise
    convolution + LayerNorm kernel at the real shape (16 streams x 100 rows x 1024 channels, fp16) within two ulps
    of float64 math rounded where PyTorch rounds, its next context exact; then several streams through the graphed
    fp16 runner (PLAN) with the stages over rows: >= 45 dB from the same runner with them off and no noisier
    against the fp32 decoder by more than 0.5 dB, the rows path having run."""
    import torch.nn.functional as F
    from voxflow.kernels.dwconv_layer_norm import dwconv_layer_norm
    from voxflow.models.qwen3_tts import codec_upsample_cl
    g = torch.Generator("cuda").manual_seed(3)
    c = 1024
    x = torch.randn(16, 100, c, device="cuda", generator=g).half()
    ctx = torch.randn(16, c, 6, device="cuda", generator=g).half()
    w = (torch.randn(c, 1, 7, device="cuda", generator=g) * 0.3).half()
    bias, nw, nb = (torch.randn(c, device="cuda", generator=g).half() for _ in range(3))
    new = torch.empty_like(ctx)
    got = dwconv_layer_norm(x, ctx, w, bias, nw, nb, 1e-6, new)
    padded = torch.cat([ctx, x.transpose(1, 2)], -1).double()
    h = F.conv1d(padded, w.double(), bias.double(), groups=c).half().double().transpose(1, 2)
    want = F.layer_norm(h, (c,), nw.double(), nb.double(), 1e-6).half()
    assert torch.equal(new, padded[..., -6:].half())
    # (one ulp of the output, or one of the rounded convolution carried through the norm: |y - nb| ulps)
    bound = (want.double().abs() + nb.double().abs()[None, None, :] + 1e-3) * 2 ** -9
    assert ((got.double() - want.double()).abs() <= bound).all()
    reference, _ = run_plan(Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True))
    low = cast_decoder(dec, torch.float16)
    monkeypatch.setattr(codec_upsample_cl, "ENABLED", False)
    off, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    calls = []
    real = codec_upsample_cl.upsample_rows
    monkeypatch.setattr(codec_upsample_cl, "upsample_rows", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(codec_upsample_cl, "ENABLED", True)
    on, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    assert calls                                              # (counted while the graphs were captured)
    for k in PLAN:
        print(k, snr_db(off[k], on[k]), snr_db(reference[k], on[k]), snr_db(reference[k], off[k]))
        assert snr_db(off[k], on[k]) > 45.0, k
        assert snr_db(reference[k], on[k]) >= snr_db(reference[k], off[k]) - 0.5, k


def test_split_n_convolutions_equal_the_one_tile_kernel(dec, monkeypatch):
    """VOXFLOW_CONV_SPLIT_N (on by default): the TMA kernel's columns in two accumulators at the codec's shapes
    that take them (96 k=7 / k=1, 192 k=7, the sub-pixel 192 -> 288) give the one-tile kernel's outputs (bit for
    bit in session 46's conv costs; within one fp16 ulp here), and the whole fp16 stack keeps FP16_MIN_SNR_DB."""
    from voxflow.kernels import causal_conv
    _skip_without_tma()
    g = torch.Generator("cuda").manual_seed(1)
    for cin, cout, k, dil in ((96, 96, 7, 9), (96, 96, 1, 1), (192, 192, 7, 3), (192, 288, 2, 1)):
        x = torch.randn(16, 2000 + (k - 1) * dil, cin, device="cuda", generator=g).half()
        w = causal_conv.pack_weight((torch.randn(cout, cin, k, device="cuda", generator=g) / (cin * k) ** 0.5).half())
        bias = torch.randn(cout, device="cuda", generator=g).half() * 0.1
        res = torch.randn(16, 2000, cout, device="cuda", generator=g).half()
        kw = dict(snake_terms=(bias.abs() + 0.5, bias.abs() + 0.5)) if k == 7 else dict(residual=res)
        monkeypatch.setattr(causal_conv, "CONV_SPLIT_N", False)
        want = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=True, **kw)
        monkeypatch.setattr(causal_conv, "CONV_SPLIT_N", True)
        assert causal_conv.split_n_config(cin, cout, torch.float16, k) is not None
        got = causal_conv.conv1d_channels_last(x, w, bias, dil, tma=True, **kw)
        print(cin, cout, k, "equal" if torch.equal(got, want) else (got.float() - want.float()).abs().max().item())
        # (the same k blocks in the same order: equal so far; one fp16 ulp allowed should a narrower MMA round apart)
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -10, atol=1e-3)
    result = measure(dec, torch.float16, 150, seed=0)
    print(result)
    assert result["cuda_graphs"] and result["snr_db"] is not None and result["snr_db"] >= FP16_MIN_SNR_DB, result


def test_fused_tma_residual_units_equal_the_two_kernels_and_keep_the_fp16_snr(dec, monkeypatch):
    """VOXFLOW_FUSED_RESIDUAL_UNIT_TMA (residual_unit_tma.py, on by default since session 49): a 96- / 192-channel
    unit in one kernel at the codec's high-rate shapes (16 sequences x 2,000 rows), with the next SnakeBeta and the
    raw value, within 2 fp16 ulps of the two TMA convolutions it replaces (only the 1x1's summation order differs),
    also in K blocks wider than the channels' split; and the whole fp16 stack streamed with it keeps
    FP16_MIN_SNR_DB, the fused kernel having run."""
    from voxflow.kernels import causal_conv, residual_unit_tma
    _skip_without_tma()
    g = torch.Generator("cuda").manual_seed(2)
    for c, dil in ((96, 9), (192, 3), (96, 1)):
        x = torch.randn(16, 2000 + 6 * dil, c, device="cuda", generator=g).half()
        w7 = causal_conv.pack_weight((torch.randn(c, c, 7, device="cuda", generator=g) / (7 * c) ** 0.5).half())
        w1 = causal_conv.pack_weight((torch.randn(c, c, 1, device="cuda", generator=g) / c ** 0.5).half())
        b7, b1 = (torch.randn(c, device="cuda", generator=g).half() * 0.1 for _ in range(2))
        a, inv, a2, inv2 = ((torch.rand(c, device="cuda", generator=g) + 0.5).half() for _ in range(4))
        res = torch.randn(16, 2000, c, device="cuda", generator=g).half()
        h = causal_conv.conv1d_channels_last(x, w7, b7, dil, snake_terms=(a, inv), tma=True)
        want_raw, got_raw = torch.empty_like(res), torch.empty_like(res)
        want = causal_conv.conv1d_channels_last(h, w1, b1, 1, residual=res, tma=True, activation=(a2, inv2),
                                                raw_out=want_raw)
        got = residual_unit_tma.residual_unit_tma(x, w7, b7, dil, (a, inv), w1, b1, res, activation=(a2, inv2),
                                                  raw_out=got_raw)
        for name, gv, wv in (("out", got, want), ("raw", got_raw, want_raw)):
            print(c, dil, name, (gv.float() - wv.float()).abs().max().item())
            torch.testing.assert_close(gv.float(), wv.float(), rtol=2 * 2 ** -10, atol=2e-3)
        # K blocks past the channels (the probe's sweep, session 56): TMA zero-fills x's and the weights' columns
        # past C, so only the k=7 sum's order differs too
        for bk in (64, 128) if c == 96 else (128,):
            cfg = {**residual_unit_tma.CONFIGS[c], "BLOCK_K": bk, "num_stages": 3 if c == 96 else 2}
            got_k = residual_unit_tma.residual_unit_tma(x, w7, b7, dil, (a, inv), w1, b1, res, activation=(a2, inv2),
                                                        config=cfg)
            print(c, dil, bk, (got_k.float() - want.float()).abs().max().item())
            torch.testing.assert_close(got_k.float(), want.float(), rtol=2 * 2 ** -10, atol=2e-3)
    calls = []
    fused = residual_unit_tma.residual_unit_tma
    monkeypatch.setattr(residual_unit_tma, "residual_unit_tma", lambda *a, **k: calls.append(1) or fused(*a, **k))
    monkeypatch.setattr(residual_unit_tma, "ENABLED", True)
    result = measure(dec, torch.float16, 150, seed=0)
    print(result, len(calls))
    assert calls and result["cuda_graphs"], result
    assert result["snr_db"] is not None and result["snr_db"] >= FP16_MIN_SNR_DB, result


def test_auto_codec_dtype_picks_fp16_for_the_real_size_decoder(dec):
    """codec_dtype="auto" on the GPU: the load-time check (codec_precision.py) passes at the real size and picks fp16;
    the cuDNN / matmul TF32 switches it turns off for its reference come back as they were (on, as serving has
    them; this module turns them off for its own tests)."""
    from voxflow.models.qwen3_tts.codec_precision import AUTO_MIN_SNR_DB, resolve_codec_dtype
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        chosen, report = resolve_codec_dtype("auto", dec)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False     # as the module has them
    print(report)
    assert chosen == "float16" and report["check"]["finite"] and report["check"]["snr_db"] >= AUTO_MIN_SNR_DB


def test_decode_async_on_the_codec_stream_equals_sync_decode(dec):
    codes = [codes_for(n, seed=40 + i) for i, n in enumerate((25, 25, 10))]
    sync_runner = Qwen3CodecRunner.from_decoder(dec, max_rows=4)
    sync_states = [sync_runner.new_state(None) for _ in codes]
    want, _ = sync_runner.decode(sync_states, codes, final=[False, False, True])

    runner = Qwen3CodecRunner.from_decoder(dec, max_rows=4)
    states = [runner.new_state(None) for _ in codes]
    # Frames made on the caller's stream behind a long kernel: a codec stream that did not wait for it would
    # read the zeros (and different audio would come out).
    frames = [torch.zeros(c.shape, dtype=torch.long, device="cuda") for c in codes]
    torch.cuda._sleep(200_000_000)
    for f, c in zip(frames, codes):
        f.add_(c.cuda())
    pending = runner.decode_async(states, frames, final=[False, False, True])
    del frames                                                   # record_stream keeps their memory for the codec
    got = pending.result()
    assert pending.ready()
    assert [p.shape for p in got] == [w.shape for w in want]
    for w, p in zip(want, got):
        assert np.abs(w - p).max() <= TOL

    # two calls queued back to back on the codec stream, collected afterwards in the other order
    more = [codes_for(25, seed=50 + i) for i in range(3)]
    p1 = runner.decode_async(states[:2], more[:2])
    p2 = runner.decode_async(states[:2], more[1:])
    r2, r1 = p2.result(), p1.result()
    s1, _ = sync_runner.decode(sync_states[:2], more[:2])
    s2, _ = sync_runner.decode(sync_states[:2], more[1:])
    for a, b in zip(r1 + r2, s1 + s2):
        assert np.abs(a - b).max() <= TOL

    # `after`: the codec stream waits for that event only; frames given as the one-frame pieces the talker made
    last = [codes_for(5, seed=60 + i) for i in range(2)]
    pieces = [[torch.zeros((1, 16), dtype=torch.long, device="cuda") for _ in range(5)] for _ in last]
    torch.cuda._sleep(200_000_000)
    for block, c in zip(pieces, last):
        for t, p in enumerate(block):
            p.add_(c[t: t + 1].cuda())
    made = torch.cuda.Event()
    made.record()
    torch.cuda._sleep(200_000_000)                               # later caller work the codec need not wait for
    got = runner.decode_async(states[:2], pieces, final=[True, True], after=made).result()
    want, _ = sync_runner.decode(sync_states[:2], last, final=[True, True])
    for w, p in zip(want, got):
        assert np.abs(w - p).max() <= TOL
    torch.cuda.synchronize()


def test_warmup_captures_the_bucketed_shapes(dec):
    runner = Qwen3CodecRunner.from_decoder(dec, max_rows=8)
    seconds = runner.warmup([1, 3], [1, 25, 12])
    assert seconds > 0
    assert set(runner.graphs.graphs) == {(b, m) for b in (1, 4) for m in (1, 2, 10, 25)}


def test_warmup_runs_in_the_graphs_own_memory(dec):
    """A capture's eager warm-up allocates from the graphs' shared pool: once the largest graph holds the pool's
    memory, a smaller shape's warm-up and capture reserve nothing new. (Outside the pool, each warm-up's activations
    were fresh memory beside the pool's, freed only when its capture began: ~0.75 GiB of the 0.6B engine's peak in
    fp16, session 21 call 1's allocator history.)"""
    runner = Qwen3CodecRunner.from_decoder(dec, max_rows=16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    runner.warmup([16], [25])                # the largest graph first: its working memory is the pool's
    torch.cuda.synchronize()
    largest = torch.cuda.memory_reserved() - before
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    runner.warmup([8], [25])
    torch.cuda.synchronize()
    transient = torch.cuda.max_memory_reserved() - base
    assert (16, 25) in runner.graphs and (8, 25) in runner.graphs
    assert largest > 256 * 2**20             # the 16 x 25 graph holds its activations: the pool is not empty
    assert transient <= 32 * 2**20, (transient / 2**20, largest / 2**20)


def test_warmup_of_every_engine_shape_reserves_about_what_the_largest_graph_does(dec):
    """The engine's warm-up captures every (batch bucket, piece) shape of codec calls of <= 16 into one pool; taken
    largest first (Qwen3CodecRunner.warmup_shapes), the 24 smaller graphs fit in the memory the 16 x 25 one
    leaves free after its capture: the pool grows by little more than their static outputs (~10 MiB in fp32) over
    the largest graph's alone. Captured smallest first (before), the 0.6B engine's fp16 codec pool held 1,342 MiB
    for 135 MiB allocated (H200 session 28 call 5)."""
    import gc

    def reserved_by(batch_sizes, frame_counts) -> int:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        runner = Qwen3CodecRunner.from_decoder(dec, max_rows=16)
        runner.warmup(batch_sizes, frame_counts)
        torch.cuda.synchronize()
        used = torch.cuda.memory_reserved() - before
        del runner
        gc.collect()
        torch.cuda.empty_cache()
        return used

    largest = reserved_by([16], [25])
    every = reserved_by([1, 2, 4, 8, 16], [1, 2, 5, 10, 25])
    assert largest > 256 * 2**20                     # the largest graph's activations: the test measures something
    assert every <= largest + 64 * 2**20, (every / 2**20, largest / 2**20)


def test_codec_on_an_sm_partition_equals_the_whole_gpu(dec):
    """stream_sms: the codec stream in a CUDA green context of 48 SMs (engine/sm_partition.py) decodes the plan to
    the same PCM as the default stream, graphs and all."""
    whole = Qwen3CodecRunner.from_decoder(dec, max_rows=8)
    part = Qwen3CodecRunner.from_decoder(dec, max_rows=8, stream_sms=48)
    assert part._partition is not None and whole._partition is None and part.stream_sms == 48
    auto = Qwen3CodecRunner.from_decoder(dec, max_rows=8, stream_sms="auto")    # EngineConfig's default
    assert auto.stream_sms == auto_sms(torch.cuda.get_device_properties(0).multi_processor_count)
    want, _ = run_plan(whole)
    got, _ = run_plan(part)
    assert (4, 25) in part.graphs
    for k in PLAN:
        assert np.abs(got[k] - want[k]).max() <= TOL, k


# A runner collected before the frame tensors it read (tune_causal_conv.py's codec_call: the runner is the first
# local, so it goes first): the runner marks the caller's frames with record_stream for its partitioned stream, so
# freeing them afterwards records an event on that stream, whose green context must still be alive.
FRAMES_OUTLIVE_RUNNER = """
import torch
from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
from voxflow.tools.codec_snr import random_real_codec_decoder
runner = Qwen3CodecRunner.from_decoder(random_real_codec_decoder("cuda"), max_rows=2, stream_sms=48)
states = [runner.new_state(None) for _ in range(2)]
frames = [torch.randint(0, 2048, (3, 16), device="cuda") for _ in range(2)]
runner.decode(states, frames)
del runner
torch.cuda.synchronize()
del frames, states
torch.cuda.synchronize()
print("freed")
"""


def test_frames_freed_after_their_partitioned_runner_end_cleanly():
    """Session 24 call 3 aborted with "CUDA error: context is destroyed" when a partitioned runner was collected
    before the frames it had read; sm_partition keeps the green contexts alive, so the process ends with 0."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", FRAMES_OUTLIVE_RUNNER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "freed" in done.stdout, done.stderr[-2000:]


def test_fused_codec_kernels_equal_the_plain_torch_decoder(dec, monkeypatch):
    """The codec's GPU-only paths (the channels-last waveform stack of codec_waveform_cl.py with its Triton
    convolutions, transposed convolutions as GEMM + overlap-add, biases folded into SnakeBeta and the residual add)
    against the same decoder with every kernel switched off (plain cuDNN / PyTorch), fp32 with TF32 off, streamed
    through the graphed runner: within TOL (the GEMMs sum in another order than cuDNN's kernels). Then the same
    with the channels-last stack off (the [B, C, T] kernel path)."""
    import voxflow.kernels as switch
    from voxflow.models.qwen3_tts import codec_waveform_cl
    calls = []
    stack = codec_waveform_cl.waveform_stack
    monkeypatch.setattr(codec_waveform_cl, "waveform_stack", lambda *a: calls.append(1) or stack(*a))
    fused = Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True)
    got, codes = run_plan(fused)
    assert calls                                                 # the channels-last stack did run (and was captured)
    monkeypatch.setattr(switch, "_enabled", False)
    plain = Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True)
    want, _ = run_plan(plain)
    for k in PLAN:
        assert np.abs(got[k] - want[k]).max() <= TOL, k
        assert want[k].std() > 0.05
    monkeypatch.setattr(switch, "_enabled", True)
    monkeypatch.setattr(codec_waveform_cl, "ENABLED", False)
    calls.clear()
    ncl = Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True)
    got_ncl, _ = run_plan(ncl)
    assert not calls
    for k in PLAN:
        assert np.abs(got_ncl[k] - want[k]).max() <= TOL, k


@pytest.mark.parametrize("dtype, apart_db", [(torch.bfloat16, 30.0), (torch.float16, 45.0)])
def test_half_channels_last_stack_is_close_to_the_half_ncl_kernels(dec, monkeypatch, dtype, apart_db):
    """bf16 / fp16: the channels-last stack against the [B, C, T] kernel path, streamed through the graphed runner,
    both held to the fp32 decoder: the channels-last stack may round differently (summation order, the output
    conv's rounding, see causal_conv.py) but must be no noisier than the [B, C, T] path by more than 1 dB. The two
    bf16 paths differ from each other by 34.3 dB on the H200 (2026-12-01), so they are held to >= 30 dB apart;
    fp16 keeps 3 more mantissa bits (~18 dB): >= 45 dB."""
    from voxflow.models.qwen3_tts import codec_waveform_cl
    want, _ = run_plan(Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True))
    low = cast_decoder(dec, dtype)
    cl, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    monkeypatch.setattr(codec_waveform_cl, "ENABLED", False)
    ncl, _ = run_plan(Qwen3CodecRunner.from_decoder(low, max_rows=8, cuda_graphs=True))
    for k in PLAN:
        assert snr_db(ncl[k], cl[k]) > apart_db, k
        assert snr_db(want[k], cl[k]) >= snr_db(want[k], ncl[k]) - 1.0, k


@pytest.mark.parametrize("level, subpixel", [(1, False), (2, False), (2, True)])
def test_activations_in_the_convolutions_epilogues_keep_the_audio(dec, monkeypatch, level, subpixel):
    """codec_waveform_cl.ACT_IN_EPILOGUE (the next SnakeBeta applied by the kernel before it, `level` 1: before each
    next block, 2: also before every unit): fp32 (TF32 off) streamed through the graphed runner
    within TOL of the plain decoder, and fp16 (the served dtype, TMA convolutions as by default) keeps
    FP16_MIN_SNR_DB, each with fewer SnakeBeta passes than the 17 a stack run makes without it; with either form of
    transposed convolution (sub-pixel: its two-tap convolution stores the unit's input twice, through TMA in fp16).
    The fused residual unit stays off (it keeps its own pass)."""
    import voxflow.kernels as switch
    from voxflow.kernels import causal_conv, residual_unit
    from voxflow.models.qwen3_tts import codec_waveform_cl
    monkeypatch.setattr(codec_waveform_cl, "ACT_IN_EPILOGUE", level)
    monkeypatch.setattr(codec_waveform_cl, "SUBPIXEL", subpixel)
    monkeypatch.setattr(residual_unit, "ENABLED", False)
    passes, stacks = [], []
    snake, stack = causal_conv.snake_channels_last, codec_waveform_cl.waveform_stack
    monkeypatch.setattr(causal_conv, "snake_channels_last", lambda *a, **k: passes.append(1) or snake(*a, **k))
    monkeypatch.setattr(codec_waveform_cl, "waveform_stack", lambda *a: stacks.append(1) or stack(*a))
    got, _ = run_plan(Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True))
    assert stacks and len(passes) == len(stacks) * (13 if level == 1 else 1)
    monkeypatch.setattr(switch, "_enabled", False)
    want, _ = run_plan(Qwen3CodecRunner.from_decoder(dec, max_rows=8, cuda_graphs=True))
    for k in PLAN:
        assert np.abs(got[k] - want[k]).max() <= TOL, k
    monkeypatch.setattr(switch, "_enabled", True)
    result = measure(dec, torch.float16, 150, seed=0)
    print(level, subpixel, result)
    assert result["cuda_graphs"] and result["snr_db"] is not None and result["snr_db"] >= FP16_MIN_SNR_DB, result


def test_gpu_fp16_check_holds_the_fp16_kernels_against_the_plain_fp32_decode(dec):
    """codec_dtype="auto" (codec_precision.py) on the GPU: the check's fp32 reference is the plain PyTorch decode
    (the kernels off: no fp32 codec kernel compiled for it alone, since session 65), the fp16 copy runs the kernels,
    and the real-size decoder passes at fp16's level (session 63's servers: 45.84 dB against the kernels' fp32
    decode; 40 dB leaves room for the plain reference's own rounding and still fails a broken fp16 path)."""
    from voxflow.models.qwen3_tts.codec_precision import resolve_codec_dtype
    chosen, report = resolve_codec_dtype("auto", dec)
    print(report)
    check = report["check"]
    assert chosen == "float16" and check["reference"] == "plain"
    assert check["finite"] and check["snr_db"] is not None and check["snr_db"] >= 40.0
