"""The code predictor's four-kernel decode layer (voxflow/kernels/cp_layer.py: norm_linear.py, attention_o_proj.py,
skinny_linear.py) on CUDA at the real 1.7B shapes, against the plain torch code (kernel switch off) with the
tolerances of tests/test_kernel_cp_layer.py (its docstring says why), plus what only the GPU can show:

- the launch configs the heuristic picks at 1, 2 and 4 rows, and the tuning script's candidate overrides;
- attention_o_proj against the two kernels it replaces (dense_decode_norm_rope + skinny o_proj): the new value
  bit-equal, the new key within 1 ulp, the output >= 99% bit-equal in bf16 (fp32 sums in other orders can flip a
  rounding; under the interpreter the old kernels' `.to(bf16)` truncates, so this comparison is GPU-only);
- a whole layer (fp32 and bf16) and five layers x 14 steps captured in a CUDA graph, replayed on new inputs;
- CodePredictor.predict at the 1.7B shapes with CP_FUSED_LAYER on vs off: the fused layer ran on every
  single-token step and (CP_FUSED_PREFILL) on the 2-token first step, fp32 greedy codes equal, bf16 teacher-forced logits within 5e-2 of max |logit| (the CPU
  test's bound) and greedy codes equal up to the first near-tie (random weights make near-ties likely: where the
  codes first differ, the fused path's pick must be within twice the logit error of the reference's maximum).
"""
import contextlib
import copy

import pytest
import torch

import voxflow.kernels as switch
from cp_layer_reference import (EPS, REAL, attention_inputs, attention_reference, clone_cache, make_cache,
                                make_code_predictor, make_layer, norm_linear_inputs, norm_linear_reference)
from float_compare import ulp_distance

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

DEV = "cuda"


@pytest.fixture(autouse=True)
def exact_references():
    """fp32 references without TF32, bf16 ones without reduced-precision split-K sums; the kernel switch kept."""
    m = torch.backends.cuda.matmul
    saved = m.allow_tf32, m.allow_bf16_reduced_precision_reduction, switch.kernels_enabled()
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = False, False
    yield
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = saved[:2]
    switch.set_kernels_enabled(saved[2])


@contextlib.contextmanager
def torch_only():
    on = switch.kernels_enabled()
    switch.set_kernels_enabled(False)
    try:
        yield
    finally:
        switch.set_kernels_enabled(on)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("name,n,swiglu", [("qkv", 4096, False), ("gate_up", 3072, True), ("lm_head", 2048, False)])
def test_norm_linear_real_shapes(name, n, swiglu, m, dtype):
    from voxflow.kernels.norm_linear import norm_linear
    x, w, nw = norm_linear_inputs(m, n, 1024, dtype, swiglu, device=DEV)
    got = norm_linear(x, w, nw, EPS, swiglu=swiglu)
    with torch_only():
        y, y32, scale = norm_linear_reference(x, w, nw, swiglu)
    if dtype == torch.float32:
        assert (got - y).abs().max().item() <= 1e-5 * y.abs().max().item()
    else:
        bound = 2.0 ** -7 * scale if swiglu else 2.0 ** -8 * y32.abs() + 2.0 ** -12 * scale
        assert ((got.float() - y32).abs() <= bound).all(), ((got.float() - y32).abs() / scale).max().item()
        assert ((got.float() - y.float()).abs() <= 2.0 ** -7 * scale).all()
    assert torch.equal(got, norm_linear(x, w, nw, EPS, swiglu=swiglu))          # deterministic


@pytest.mark.parametrize("config", [dict(BLOCK_N=4), dict(BLOCK_N=16, num_warps=8), dict(BLOCK_K=512),
                                    dict(BLOCK_K=256, num_stages=3), dict(num_stages=1), dict(BLOCK_N=32, num_warps=8)])
def test_norm_linear_config_overrides(config):
    from voxflow.kernels.norm_linear import norm_linear
    for n, swiglu in ((4096, False), (3072, True)):
        x, w, nw = norm_linear_inputs(1, n, 1024, torch.bfloat16, swiglu, seed=1, device=DEV)
        with torch_only():
            _, y32, scale = norm_linear_reference(x, w, nw, swiglu)
        got = norm_linear(x, w, nw, EPS, swiglu=swiglu, config=config)
        assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), (config, swiglu)


def _run_attention(a, config=None):
    from voxflow.kernels.attention_o_proj import attention_o_proj
    return attention_o_proj(a["qkv"], a["residual"], a["w_o"], a["q_weight"], a["k_weight"], EPS, EPS, a["cos"],
                            a["sin"], a["k_cache"], a["v_cache"], a["length"], a["num_heads"], a["scale"],
                            config=config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4])
def test_attention_o_proj_matches_torch(m, dtype):
    for length in (0, 1, 8, 14, 15):
        a = attention_inputs(REAL, m, length, dtype, seed=length, per_row_rope=m > 1, device=DEV)
        k_before, v_before = a["k_cache"].clone(), a["v_cache"].clone()
        with torch_only():
            want, want32, scale, keys, values = attention_reference(a)
        got = _run_attention(a)
        if dtype == torch.float32:
            assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), length
            new_k = a["k_cache"][:, :, length]
            assert (new_k - keys[:, :, length]).abs().max().item() <= 1e-5 * new_k.abs().max().item()
        else:
            assert ((got.float() - want32).abs() <= 2.0 ** -7 * scale).all(), length
            assert (ulp_distance(got, want) == 0).float().mean().item() >= 0.95, length
            # the key: qk_norm_rope's rounding; on the GPU rsqrt / sum order may flip a rare bf16 rounding
            assert (ulp_distance(a["k_cache"][:, :, length], keys[:, :, length]) <= 1).all()
        assert torch.equal(a["v_cache"][:, :, length], values[:, :, length])
        for c, before in ((a["k_cache"], k_before), (a["v_cache"], v_before)):
            assert torch.equal(c[:, :, :length], before[:, :, :length])
            assert torch.equal(c[:, :, length + 1:], before[:, :, length + 1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [None, dict(BLOCK_H=16, BLOCK_N=32)])
def test_attention_o_proj_joint_equals_two_calls(config, dtype):
    """The joint form (the code predictor's 2-token first step at one row, CP_JOINT_PREFILL) at the real shapes,
    with the default tiles (partial sums of 4 head blocks) and one head block: the same cache bits as two one-token
    calls in order; outputs fp32 within 1e-5 of max |out|, bf16 within 2^-7 of scale and >= 95% bit-equal (the
    first token's softmax term is summed in another order); eagerly and replayed from a CUDA graph."""
    from voxflow.kernels.attention_o_proj import attention_o_proj
    for length in (0, 7):
        a = attention_inputs(REAL, 2, length, dtype, seed=length, per_row_rope=True, device=DEV)
        k0, v0 = a["k_cache"][:1].clone(), a["v_cache"][:1].clone()
        args = (a["w_o"], a["q_weight"], a["k_weight"], EPS, EPS)
        seq_k, seq_v = k0.clone(), v0.clone()
        want = torch.cat([attention_o_proj(a["qkv"][t:t + 1], a["residual"][t:t + 1], *args, a["cos"][t],
                                           a["sin"][t], seq_k, seq_v, length + t, a["num_heads"], a["scale"],
                                           config=config) for t in range(2)])
        jk, jv = k0.clone(), v0.clone()

        def joint():
            return attention_o_proj(a["qkv"], a["residual"], *args, a["cos"], a["sin"], jk, jv, length,
                                    a["num_heads"], a["scale"], config=config, joint=True)
        got = joint()
        assert torch.equal(jk, seq_k) and torch.equal(jv, seq_v), length
        if dtype == torch.float32:
            assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), length
        else:
            assert ((got.float() - want.float()).abs() <= 2.0 ** -7 * a["scale"] * want.float().abs().max()).all()
            assert (ulp_distance(got, want) == 0).float().mean().item() >= 0.95, length
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = joint()
        jk.copy_(k0), jv.copy_(v0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, got) and torch.equal(jk, seq_k) and torch.equal(jv, seq_v), length


@pytest.mark.parametrize("config", [dict(BLOCK_H=1, BLOCK_N=32), dict(BLOCK_H=4, BLOCK_N=128),
                                    dict(BLOCK_H=8, BLOCK_N=128, num_warps=8), dict(BLOCK_N=16), dict(BLOCK_N=128),
                                    dict(BLOCK_H=16, BLOCK_N=8), dict(num_warps=8), dict(num_warps=2)])
def test_attention_o_proj_config_overrides(config):
    a = attention_inputs(REAL, 2, 9, torch.bfloat16, seed=3, device=DEV)
    with torch_only():
        _, want32, scale, keys, _ = attention_reference(a)
    got = _run_attention(a, config)
    assert ((got.float() - want32).abs() <= 2.0 ** -7 * scale).all(), config
    assert (ulp_distance(a["k_cache"][:, :, 9], keys[:, :, 9]) <= 1).all()


@pytest.mark.parametrize("m", [1, 4])
def test_attention_o_proj_matches_the_two_kernels_it_replaces(m):
    from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append
    from voxflow.kernels.skinny_linear import skinny_linear
    for length in (0, 7, 15):
        a = attention_inputs(REAL, m, length, torch.bfloat16, seed=10 + length, device=DEV)
        kc, vc = a["k_cache"].clone(), a["v_cache"].clone()
        hq, hkv, d = 16, 8, 128
        qkv = a["qkv"]
        q = qkv[:, :hq * d].view(m, 1, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(m, 1, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(m, 1, hkv, d)
        out = norm_rope_attend_append(q, k, v, a["q_weight"], a["k_weight"], EPS, EPS, a["cos"], a["sin"], kc, vc,
                                      length, a["scale"])
        old = skinny_linear(out.reshape(m, -1), a["w_o"], residual=a["residual"])
        got = _run_attention(a)
        # the same formulas; the fp32 sum of squares may be reduced in another tree order (other layouts)
        assert (ulp_distance(a["k_cache"], kc) <= 1).all() and torch.equal(a["v_cache"], vc), length
        assert (ulp_distance(got, old) == 0).float().mean().item() >= 0.99, length


def _layer_step(layer, x, cos, sin, cache):
    from voxflow.kernels import cp_layer
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    w = _layer_weights(layer)
    assert cp_layer.supported(x, w, cos, sin, cache.k, cache.v)
    return cp_layer.layer_step(x, w, cos, sin, cache.k, cache.v, cache.claim())


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4])
def test_layer_matches_the_torch_layer(m, dtype):
    from voxflow.layers.rotary import RotaryEmbedding
    for length in (0, 1, 14):
        layer = make_layer(REAL, dtype, seed=length, device=DEV)
        g = torch.Generator(device=DEV).manual_seed(length)
        x = (torch.randn(m, REAL["hidden"], generator=g, device=DEV) * 4).to(dtype)
        cos, sin = RotaryEmbedding(128, 1e6, 64).to(DEV)._compute(torch.tensor([[length]], device=DEV), dtype)
        cache = make_cache(REAL, m, length, dtype, device=DEV)
        ref_cache = clone_cache(cache)
        with torch_only():
            want = layer(x[:, None], cos, sin, ref_cache, None)[:, 0]
        got = _layer_step(layer, x, cos, sin, cache)
        if dtype == torch.float32:
            assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), length
            continue
        layer32 = copy.deepcopy(layer).float()
        cache32 = make_cache(REAL, m, length, dtype, device=DEV)
        cache32.k, cache32.v = cache32.k.float(), cache32.v.float()
        with torch_only():
            want32 = layer32(x.float()[:, None], cos.float(), sin.float(), cache32, None)[:, 0]
        err_fused = (got.float() - want32).abs().max().item()
        err_ref = (want.float() - want32).abs().max().item()
        assert err_fused <= 1.5 * err_ref + 2.0 ** -9 * want32.abs().max().item(), (length, err_fused, err_ref)


@torch.no_grad()
def test_five_layers_in_a_cuda_graph():
    """Five layers x 14 steps (cache lengths 1..14) captured once; new inputs and weights in place; one replay
    gives what the same steps give eagerly."""
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    dtype, m = torch.bfloat16, 1
    layers = [make_layer(REAL, dtype, seed=i, device=DEV) for i in range(5)]
    cos_all, sin_all = RotaryEmbedding(128, 1e6, 64).to(DEV).prefix(16, torch.device(DEV), dtype)
    x0 = (torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype)
    cache = StaticKVCache(5, m, 8, 16, 128, dtype, torch.device(DEV))

    def frame():
        for c in cache.layers:
            c.length = 1
        x = x0
        for t in range(1, 15):
            for layer, c in zip(layers, cache.layers):
                x = _layer_step(layer, x, cos_all[:, t:t + 1], sin_all[:, t:t + 1], c)
        return x
    for c in cache.layers:
        c.k.normal_()
        c.v.normal_()
    frame()                                               # compile, fuse the weights, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame()
    x0.copy_((torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype))
    layers[2].mlp.down_proj.weight.data.mul_(0.5)
    layers[3].self_attn.o_proj.weight.data.mul_(-1)
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    assert torch.equal(replayed, frame())


def predict_on_vs_off(switch, calls: list, rows: int, dtype, tol: float, expected: int = 5 * 14,
                      talker: int = 2048):
    """CodePredictor.predict at the 1.7B shapes (talker 1024: the 0.6B's, no projection) with `switch(on)` off,
    then on: the path it turns on ran on every step it takes (`calls`, filled by the caller's spy, counts
    `expected`: 5 layers x 14 single-token steps unless said), and teacher-forced with the off path's codes its
    logits are within tol of max |logit|. -> (codes on, codes off, logits off, max error)."""
    cp = make_code_predictor(dtype, DEV, talker_hidden_size=talker)
    h, c0 = (torch.randn(rows, talker, device=DEV) * 2).to(dtype), torch.randn(rows, talker, device=DEV).to(dtype)
    greedy = lambda logits, j: logits.argmax(-1)            # noqa: E731
    switch(False)
    codes_off, logits_off = cp.predict(h, c0, greedy)
    forced = lambda logits, j: codes_off[:, j]              # noqa: E731
    switch(True)
    calls.clear()
    codes_on, _ = cp.predict(h, c0, greedy)
    assert len(calls) == expected, "the path did not run on every step it takes"
    _, logits_forced = cp.predict(h, c0, forced)
    err = (logits_forced.float() - logits_off.float()).abs().max().item()
    assert err <= tol * logits_off.float().abs().max().item(), (dtype, err)
    return codes_on, codes_off, logits_off, err


def assert_codes_equal_up_to_near_ties(codes_on, codes_off, logits_off, err):
    """Per row, the first code that differs must be one the reference's logits put within twice the logit error of
    their maximum (a near-tie the rounding may flip); later codes follow from it and are not compared."""
    for row in (codes_on != codes_off).any(dim=1).nonzero().flatten().tolist():
        j = int((codes_on[row] != codes_off[row]).nonzero()[0])
        step = logits_off[row, j].float()
        assert step[codes_on[row, j]] >= step.max() - 2 * err, (row, j, codes_on[row], codes_off[row])


@torch.no_grad()
def test_predict_fused_layer_on_vs_off():
    """CP_FUSED_LAYER at one row: the four-kernel layer on every single-token step and, with CP_FUSED_PREFILL (the
    default), on the 2-token first step: as one pass of both positions with CP_JOINT_PREFILL (the default: 5 more
    layer steps a frame), else position by position (position 0's last layer only appends its keys / values: 4 + 5
    more)."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_layer
    saved = cp_mod.CP_FUSED_LAYER, cp_layer.layer_step
    calls = []
    cp_layer.layer_step = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    expected = 5 * 14 + ((5 if cp_mod.CP_JOINT_PREFILL else 9) if cp_mod.CP_FUSED_PREFILL else 0)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            codes_on, codes_off, logits_off, err = predict_on_vs_off(
                lambda on: setattr(cp_mod, "CP_FUSED_LAYER", on), calls, 1, dtype, 5e-2, expected)
            if dtype == torch.float32:
                assert torch.equal(codes_on, codes_off)
            else:       # bf16 may pick another code only where the reference's top two logits are that close
                assert_codes_equal_up_to_near_ties(codes_on, codes_off, logits_off, err)
    finally:
        cp_mod.CP_FUSED_LAYER, cp_layer.layer_step = saved


@torch.no_grad()
def test_predict_folded_norms_on_vs_off():
    """qwen3_layer.FOLDED_NORMS at 64 rows (the c=64 code predictor, above the skinny sizes): the folded layer ran on
    every single-token step (silu_mul_folded counted) and on the 2-token first step (one pass with CP_JOINT_PREFILL,
    the default, which needs the folded layers; else two with CP_SPLIT_PREFILL); teacher-forced logits within 5e-2
    of max |logit| (fp32: 1e-4); greedy codes equal up to near-ties (as above, per row; 960 draws make them likely
    even in fp32)."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import silu_mul as sm
    saved = layer_mod.FOLDED_NORMS, sm.silu_mul_folded
    calls = []
    sm.silu_mul_folded = lambda *a: (calls.append(1), saved[1](*a))[1]
    first = 1 if cp_mod.CP_JOINT_PREFILL else 2 * cp_mod.CP_SPLIT_PREFILL      # folded passes of the first step
    try:
        for dtype in (torch.float32, torch.bfloat16):
            # 64 rows x 15 draws: even fp32's last-bit differences may meet a near-tie, so the same rule for both
            # dtypes (fp32's error bound is ~1e-6 of the logits: only true near-ties pass)
            assert_codes_equal_up_to_near_ties(*predict_on_vs_off(
                lambda on: setattr(layer_mod, "FOLDED_NORMS", on), calls, 64, dtype,
                1e-4 if dtype == torch.float32 else 5e-2, expected=5 * (14 + first)))
    finally:
        layer_mod.FOLDED_NORMS, sm.silu_mul_folded = saved


@torch.no_grad()
def test_predict_cp_skinny_gemms_on_vs_off():
    """qwen3_layer.CP_SKINNY_GEMMS at 64 rows (the 0.6B's code predictor shape): the folded layer's four GEMMs on
    skinny_linear (counted: 4 a single-token layer step; the joint 2-token first step's 128 rows stay on cuBLAS)
    hold the cuBLAS path's teacher-forced logits within 5e-2 of max |logit| (fp32: 1e-4), greedy codes equal up to
    near-ties."""
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import skinny_linear as sk
    saved = layer_mod.CP_SKINNY_GEMMS, sk.skinny_linear
    calls = []
    sk.skinny_linear = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    try:
        for dtype in (torch.float32, torch.bfloat16):
            assert_codes_equal_up_to_near_ties(*predict_on_vs_off(
                lambda on: setattr(layer_mod, "CP_SKINNY_GEMMS", on), calls, 64, dtype,
                1e-4 if dtype == torch.float32 else 5e-2, expected=4 * 5 * 14, talker=1024))
    finally:
        layer_mod.CP_SKINNY_GEMMS, sk.skinny_linear = saved


@torch.no_grad()
def test_predict_split_prefill_on_vs_off():
    """CP_SPLIT_PREFILL at 64 rows (above the fused layers' row limit): the 2-token first step position by position
    through the folded single-token layers (silu_mul_folded counted: 5 layers x (14 steps + 2 positions)), no eager
    attention anywhere; teacher-forced logits within 5e-2 of max |logit| (fp32: 1e-4), greedy codes equal up to
    near-ties (as the folded-norms test). CP_JOINT_PREFILL held off: on (the default), the joint pass would take
    that step at these rows whatever CP_SPLIT_PREFILL says."""
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import silu_mul as sm
    saved = cp_mod.CP_SPLIT_PREFILL, sm.silu_mul_folded, cache_mod.eager_attention, cp_mod.CP_JOINT_PREFILL
    calls, eager = [], []
    sm.silu_mul_folded = lambda *a: (calls.append(1), saved[1](*a))[1]
    cache_mod.eager_attention = lambda *a: (eager.append(cp_mod.CP_SPLIT_PREFILL), saved[2](*a))[1]
    cp_mod.CP_JOINT_PREFILL = False
    try:
        for dtype in (torch.float32, torch.bfloat16):
            assert_codes_equal_up_to_near_ties(*predict_on_vs_off(
                lambda on: setattr(cp_mod, "CP_SPLIT_PREFILL", on), calls, 64, dtype,
                1e-4 if dtype == torch.float32 else 5e-2, expected=5 * 16))
            assert eager and not any(eager), "eager attention ran with the split prefill (or never without it)"
            eager.clear()
    finally:
        cp_mod.CP_SPLIT_PREFILL, sm.silu_mul_folded, cache_mod.eager_attention, cp_mod.CP_JOINT_PREFILL = saved


@torch.no_grad()
@pytest.mark.parametrize("talker", [1024, 2048])
def test_predict_joint_prefill_on_vs_off(talker):
    """CP_JOINT_PREFILL at 64 rows: the 2-token first step as one pass of 128 rows (silu_mul_folded counted:
    5 layers x (14 steps + 1 pass); the attention core took S = 2 on the 5 layers), no eager attention; against
    the split path (off): teacher-forced logits within 5e-2 of max |logit| (fp32: 1e-4), greedy codes equal up to
    near-ties. talker 2048: with the 1.7B's projection."""
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import dense_decode_norm_rope as fused_attention
    from voxflow.kernels import silu_mul as sm
    saved = (cp_mod.CP_JOINT_PREFILL, sm.silu_mul_folded, cache_mod.eager_attention,
             fused_attention.norm_rope_attend_append)
    calls, eager, joint = [], [], []
    sm.silu_mul_folded = lambda *a: (calls.append(1), saved[1](*a))[1]
    cache_mod.eager_attention = lambda *a: (eager.append(1), saved[2](*a))[1]
    fused_attention.norm_rope_attend_append = lambda *a, **kw: (joint.append(a[0].shape[1] == 2),
                                                                 saved[3](*a, **kw))[1]
    try:
        for dtype in (torch.float32, torch.bfloat16):
            joint.clear()
            assert_codes_equal_up_to_near_ties(*predict_on_vs_off(
                lambda on: setattr(cp_mod, "CP_JOINT_PREFILL", on), calls, 64, dtype,
                1e-4 if dtype == torch.float32 else 5e-2, expected=5 * 15, talker=talker))
            # (the on path's two predicts, greedy and teacher-forced, 5 layers each; the off one's are all S = 1)
            assert sum(joint) == 10 and not eager, (sum(joint), len(eager))
    finally:
        (cp_mod.CP_JOINT_PREFILL, sm.silu_mul_folded, cache_mod.eager_attention,
         fused_attention.norm_rope_attend_append) = saved


@torch.no_grad()
@pytest.mark.parametrize("talker", [1024, 2048])
def test_predict_joint_prefill_at_one_row_on_vs_off(talker):
    """CP_JOINT_PREFILL at one row (the four-kernel layers): the 2-token first step as the two rows of one pass on
    all 5 layers (layer_step with joint=True counted), against the position-by-position fused prefill (off):
    teacher-forced logits within 5e-2 of max |logit| (fp32: 1e-4), greedy codes equal up to near-ties."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_layer
    saved = cp_mod.CP_JOINT_PREFILL, cp_layer.layer_step
    calls = []
    cp_layer.layer_step = lambda *a, **kw: (calls.append(1) if kw.get("joint") else None, saved[1](*a, **kw))[1]
    try:
        for dtype in (torch.float32, torch.bfloat16):
            assert_codes_equal_up_to_near_ties(*predict_on_vs_off(
                lambda on: setattr(cp_mod, "CP_JOINT_PREFILL", on), calls, 1, dtype,
                1e-4 if dtype == torch.float32 else 5e-2, expected=5, talker=talker))
    finally:
        cp_mod.CP_JOINT_PREFILL, cp_layer.layer_step = saved


@torch.no_grad()
@pytest.mark.parametrize("talker", [1024, 2048])
def test_predict_owned_input_on_vs_off(talker):
    """code_predictor.OWNED_INPUT at 64 rows with the engine's fused draws (batch_sampling.residual_sample_fn, half
    the rows sampling), bf16, without a projection (talker 1024, the 0.6B's: the draws copy each row twice) and with
    one (2048, the 1.7B's: projected table rows): the same codes and frame embedding, bit for bit, on and off
    (addmm_ into the input is the GEMM torch.addmm runs after its copy); the input tables unchanged."""
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.models.qwen3_tts.sampling import WarpParams
    cp = make_code_predictor(torch.bfloat16, DEV, talker_hidden_size=talker)
    h = (torch.randn(64, talker, device=DEV) * 2).to(torch.bfloat16)
    c0 = torch.randn(64, talker, device=DEV).to(torch.bfloat16)
    sampling = [i % 2 == 0 for i in range(64)]
    params = WarpParams.build(sampling, [0.9] * 64, [50] * 64, [0.95] * 64, DEV)
    tables = [t.weight.clone() for t in cp.model.codec_embedding]
    projected = cp.projected_tables()
    projected = None if projected is None else projected.clone()
    saved = cp_mod.OWNED_INPUT
    results = []
    try:
        for on in (True, False):
            cp_mod.OWNED_INPUT = on
            sample_fn = bs.residual_sample_fn(params, torch.arange(64, device=DEV) + 11,
                                              torch.full((64,), 7, device=DEV), True)
            results.append(cp.predict(h, c0, sample_fn, frame_embed=True))
    finally:
        cp_mod.OWNED_INPUT = saved
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert all(torch.equal(t.weight, w) for t, w in zip(cp.model.codec_embedding, tables))
    assert (projected is None) == (talker == 1024)
    assert projected is None or torch.equal(cp.projected_tables(), projected)


@torch.no_grad()
def test_predict_folded_head_on_vs_off():
    """CP_FOLDED_HEAD at 64 rows (the 0.6B's code predictor shape, fp32, greedy draws through the engine's fused
    sampler) on a code predictor whose final norm was folded into its heads: every draw scales by its rows
    (row_scale, spied), and the codes equal those with it off up to near-ties of the plain path's logits (the
    roundings moved: fp32 1e-4 of max |logit|)."""
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import select_tokens as fused
    from voxflow.layers.folded_norms import fold_final_norm_in_place
    from voxflow.models.qwen3_tts.sampling import WarpParams
    torch.backends.cuda.matmul.allow_tf32 = False
    cp = make_code_predictor(torch.float32, DEV, talker_hidden_size=1024)
    fold_final_norm_in_place(cp.model.norm, cp.lm_head)
    h, c0 = torch.randn(64, 1024, device=DEV) * 2, torch.randn(64, 1024, device=DEV)
    params = WarpParams.build([False] * 64, [1.0] * 64, [0] * 64, [1.0] * 64, DEV)
    keys, frame = torch.arange(64, device=DEV), torch.full((64,), 2, device=DEV)
    saved, real_select = cp_mod.CP_FOLDED_HEAD, fused.select_tokens
    scaled = []
    fused.select_tokens = lambda *a, **kw: (scaled.append(kw.get("row_scale") is not None), real_select(*a, **kw))[1]
    codes = {}
    try:
        for on in (True, False):
            cp_mod.CP_FOLDED_HEAD = on
            scaled.clear()
            codes[on], _ = cp.predict(h, c0, bs.residual_sample_fn(params, keys, frame, False), frame_embed=True)
            assert scaled == [on] * 15, (on, scaled)
    finally:
        cp_mod.CP_FOLDED_HEAD, fused.select_tokens = saved, real_select
    plain, logits = cp.predict(h, c0, lambda logits, j: logits.argmax(-1))
    assert torch.equal(plain, codes[False])
    assert_codes_equal_up_to_near_ties(codes[True], codes[False], logits, 1e-4 * logits.abs().max().item())
