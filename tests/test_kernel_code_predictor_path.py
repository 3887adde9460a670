"""The code predictor's whole kernel path (preallocated KV cache with q/k norms, RoPE, append and attention in one
kernel, RoPE rows from the prefix table, the skinny-GEMM decoder layers with norm / silu / residual fused in, the
final norm inside lm_head at one row) against its reference path, on CPU tensors through Triton's interpreter (in
a subprocess, see interpreter_child).

A code predictor at small but kernel-supported shapes (hidden 64, 4 query / 2 KV heads of 32, two layers, vocab
256, 5 code groups: 4 steps instead of 15, to keep the interpreter run short). Teacher-forced (sample_fn returns
fixed codes, so both paths see the same inputs at every step): fp32 logits
within 1e-4 of the reference's max |logit| (only summation orders differ), bf16 within 5e-2 of it (per-op bf16
rounding on both sides, different orders); greedy fp32: the same codes.

Both kernel paths: the per-layer one (CP_FUSED_LAYER off: seven launches a layer; at twelve rows the layers above
the skinny sizes, whose MLP residual adds go into the next norm) and the four-kernel layer of
voxflow/kernels/cp_layer.py (on, the default), each spied on to show it ran where it should. Also: the one-row
layers with the norms folded into q|k|v and gate|up (qwen3_layer.ONE_ROW_NORM_LINEAR), and that the deferred
residual adds change no bits of the stack's output.

The joint first step's, the folded head's and CP_SKINNY_GEMMS' checks, defined here too, run in
test_kernel_code_predictor_path_joint.py's own interpreter child (two children: two CI workers, each well inside
run_child's time limit).
"""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_CP_PATH_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def small_code_predictor(dtype, talker_hidden_size: int = 96):
    from voxflow.models.qwen3_tts.code_predictor import CodePredictor
    from voxflow.models.qwen3_tts.config import CodePredictorConfig
    # 4 heads of 32: the attention output (128) is twice the hidden size, as in the 1.7B code predictor (2048 vs
    # 1024), so o_proj's input is not hidden-wide.
    cfg = CodePredictorConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e6,
                              max_position_embeddings=4096, vocab_size=256, num_code_groups=5)
    torch.manual_seed(0)
    cp = CodePredictor(cfg, talker_hidden_size)    # (96: a talker wider than the predictor, the projection runs)
    for name, p in cp.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
        elif p.dim() == 2:
            p.data.normal_(0, 0.1)
    return cp.to(dtype).eval()


def case(rows: int, dtype, g: torch.Generator):
    """A fresh small code predictor and a predict's inputs for `rows` rows: the talker state, the c0 embedding."""
    cp = small_code_predictor(dtype)
    h = torch.randn(rows, 96, generator=g).to(dtype)
    return cp, h, torch.randn(rows, 96, generator=g).to(dtype)


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, tol: float, *label) -> None:
    """max |got - want| within tol of max |want| (the tolerances of the module docstring)."""
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (*label, err)


def run(cp, h, c0, kernels: bool, forced: torch.Tensor | None):
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    # (the RMSNorms stay on torch here: their kernels have their own interpreter tests, tests/
    # test_kernels_elementwise.py, and check_deferred_residual_adds_change_no_bits runs them in the layers)
    mods = (layer_mod, cache_mod, cp_mod)
    saved = [m.use_kernels for m in mods]
    for m in mods:
        m.use_kernels = (lambda t: True) if kernels else (lambda t: False)
    try:
        def sample(logits, j):
            return forced[:, j] if forced is not None else logits.argmax(-1)
        return cp.predict(h, c0, sample)
    finally:
        for m, f in zip(mods, saved):
            m.use_kernels = f


def check_kernel_path_against_reference():
    """The per-layer kernel path (fused layer switch off; one-row layers with their norms on their own kernels,
    qwen3_layer.ONE_ROW_NORM_LINEAR off: check_one_row_norm_linear_layers_against_reference holds it on)."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    saved = cp_mod.CP_FUSED_LAYER, layer_mod.ONE_ROW_NORM_LINEAR, layer_mod.FOLDED_NORMS
    cp_mod.CP_FUSED_LAYER, layer_mod.ONE_ROW_NORM_LINEAR, layer_mod.FOLDED_NORMS = False, False, False
    try:
        _check_per_layer_kernel_path()
    finally:
        cp_mod.CP_FUSED_LAYER, layer_mod.ONE_ROW_NORM_LINEAR, layer_mod.FOLDED_NORMS = saved


def check_folded_norms_path_against_reference():
    """qwen3_layer.FOLDED_NORMS (on by default): above the skinny sizes (nine rows) every single-token layer step
    runs with its norms folded into the GEMM weights (voxflow/layers/folded_norms.py): the attention core takes
    the row factor (folded_norm=, spied) and silu * up the post-attention one (silu_mul_folded, spied), no add +
    norm kernel runs on those steps (the 2-token prefill keeps the plain path: 4 of them), and the logits stay
    within the tolerances above of the reference, fp32 and bf16; fp32 greedy codes equal the reference's; the
    stack's input rows are left as they were. With CP_SPLIT_PREFILL the 2-token prefill runs position by position
    through the same folded layers: no add + norm kernel and no eager attention at all, the same tolerances.
    (CP_JOINT_PREFILL held off: on, the default, it takes that prefill at these rows, which
    check_joint_prefill_against_reference covers.)"""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import dense_decode_norm_rope as fused_attention
    from voxflow.kernels import silu_mul as sm
    spies = {"attention": [], "silu": [], "add_norm": [], "eager": []}
    real_attention, real_silu, real_add_norm, real_eager = (fused_attention.norm_rope_attend_append,
                                                            sm.silu_mul_folded, layer_mod.add_rms_norm,
                                                            cache_mod.eager_attention)
    fused_attention.norm_rope_attend_append = lambda *a, **kw: (
        spies["attention"].append(kw.get("folded_norm") is not None), real_attention(*a, **kw))[1]
    sm.silu_mul_folded = lambda *a: (spies["silu"].append(1), real_silu(*a))[1]
    layer_mod.add_rms_norm = lambda *a: (spies["add_norm"].append(1), real_add_norm(*a))[1]
    cache_mod.eager_attention = lambda *a: (spies["eager"].append(1), real_eager(*a))[1]
    saved_split, saved_joint = cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL
    cp_mod.CP_JOINT_PREFILL = False
    assert layer_mod.FOLDED_NORMS
    try:
        g = torch.Generator().manual_seed(9)
        for dtype, tol, split in ((torch.float32, 1e-4, False), (torch.bfloat16, 5e-2, False),
                                  (torch.float32, 1e-4, True), (torch.bfloat16, 5e-2, True)):
            cp_mod.CP_SPLIT_PREFILL = split
            cp, h, c0 = case(9, dtype, g)
            codes_r, logits_r = run(cp, h, c0, False, None)
            for v in spies.values():
                v.clear()
            # fp32 greedy: equal codes mean both paths saw the same inputs at every step; bf16 teacher-forced
            codes_k, logits_k = run(cp, h, c0, True, None if dtype == torch.float32 else codes_r)
            if dtype == torch.float32:
                assert torch.equal(codes_k, codes_r)
            # 2 layers x 3 single-token steps, folded (split: + 2 layers x the prefill's 2 positions)
            steps = 3 + (2 if split else 0)
            assert spies["attention"] == [True] * (2 * steps), spies["attention"]
            assert len(spies["silu"]) == 2 * steps
            # unsplit, the prefill step's only (2 post-attention, 1 + 1 deferred), and its eager attention a layer
            assert len(spies["add_norm"]) == (0 if split else 4)
            assert len(spies["eager"]) == (0 if split else 2)
            assert_logits_close(logits_k, logits_r, tol, dtype, split)
        # The folded layers add into their input in place from the second layer on, never into the stack's input
        # (the caller's: e.g. the code predictor's input rows when its projection is the identity, as in 0.6B).
        from voxflow.layers.static_kv_cache import StaticKVCache
        saved_use = layer_mod.use_kernels
        layer_mod.use_kernels = lambda t: True
        try:
            stack = small_code_predictor(torch.float32).model
            cache = StaticKVCache(2, 9, 2, 5, 32, torch.float32, torch.device("cpu"))
            cos, sin = (t[:, :1] for t in stack.rotary.prefix(5, torch.device("cpu"), torch.float32))
            x = torch.randn(9, 1, 64, generator=g)
            before, spies["silu"] = x.clone(), []
            with torch.no_grad():                   # (as predict runs: the kernels leave autograd to torch)
                out = stack(x, None, cache, rope=(cos, sin))
            assert len(spies["silu"]) == 2 and torch.equal(x, before) and not torch.equal(out, stack.norm(x))
        finally:
            layer_mod.use_kernels = saved_use
    finally:
        fused_attention.norm_rope_attend_append, sm.silu_mul_folded = real_attention, real_silu
        layer_mod.add_rms_norm, cache_mod.eager_attention = real_add_norm, real_eager
        cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL = saved_split, saved_joint


def check_cp_skinny_gemms_against_reference():
    """qwen3_layer.CP_SKINNY_GEMMS (on by default where PDL runs; set on here): at nine rows every folded single-token
    layer step runs its four GEMMs on skinny_linear (spied: q|k|v, o_proj + residual, gate|up, down + residual),
    and the logits stay within the tolerances above of the reference, fp32 and bf16; fp32 greedy codes equal the
    reference's. (CP_JOINT_PREFILL held off: the 2-token prefill keeps the plain path, so only the 3 single-token
    steps fold.)"""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import skinny_linear as sk
    assert layer_mod.MAX_SKINNY_GEMM_ROWS == sk.MAX_M
    calls, real = [], sk.skinny_linear
    sk.skinny_linear = lambda *a, **kw: (calls.append(kw.get("residual") is not None), real(*a, **kw))[1]
    saved = layer_mod.CP_SKINNY_GEMMS, cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL
    layer_mod.CP_SKINNY_GEMMS, cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL = True, False, False
    try:
        g = torch.Generator().manual_seed(11)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
            cp, h, c0 = case(9, dtype, g)
            codes_r, logits_r = run(cp, h, c0, False, None)
            calls.clear()
            codes_k, logits_k = run(cp, h, c0, True, None if dtype == torch.float32 else codes_r)
            if dtype == torch.float32:
                assert torch.equal(codes_k, codes_r)
            # 2 layers x 3 steps, each q|k|v, o_proj (+ residual), gate|up, down (+ residual)
            assert calls == [False, True, False, True] * 6, calls
            assert_logits_close(logits_k, logits_r, tol, dtype)
    finally:
        sk.skinny_linear = real
        layer_mod.CP_SKINNY_GEMMS, cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL = saved


def _check_per_layer_kernel_path():
    from voxflow.kernels import dense_decode_norm_rope as fused_attention
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.models.qwen3_tts.code_predictor import CodePredictor
    # (CP_SPLIT_PREFILL off: the counts below take the 2-token first step on the per-layer path)
    saved_split, cp_mod.CP_SPLIT_PREFILL = cp_mod.CP_SPLIT_PREFILL, False
    calls, attention_calls = [], []
    real = CodePredictor._kernel_step_logits
    CodePredictor._kernel_step_logits = lambda self, *a, **kw: (calls.append(1), real(self, *a, **kw))[1]
    real_attention = fused_attention.norm_rope_attend_append
    fused_attention.norm_rope_attend_append = lambda *a, **kw: (attention_calls.append(1), real_attention(*a, **kw))[1]
    from voxflow.kernels import skinny_linear as sk
    import voxflow.layers.qwen3_layer as layer_mod
    gemms, add_norms = [], []
    real_skinny = sk.skinny_linear
    sk.skinny_linear = lambda x, w, **kw: (gemms.append((tuple(w.shape), kw.get("gated", False))),
                                           real_skinny(x, w, **kw))[1]
    real_add_norm = layer_mod.add_rms_norm
    layer_mod.add_rms_norm = lambda *a: (add_norms.append(1), real_add_norm(*a))[1]
    g = torch.Generator().manual_seed(1)
    # One row: every fused GEMM of the path (o_proj + residual, silu*up + down_proj + residual, norm + lm_head);
    # three rows: o_proj's only (SKINNY_PROLOGUE_MAX_ROWS); twelve rows: above SKINNY_MAX_ROWS, the layers on
    # cuBLAS-sized GEMMs with every residual add fused into the norm after it (Qwen3DecoderLayer.forward_deferred).
    # (bf16 through these kernels: the one-row and fused-layer checks below run a bf16 pass each)
    for rows, dtype, tol in ((1, torch.float32, 1e-4), (3, torch.float32, 1e-4), (12, torch.float32, 1e-4)):
        cp, h, c0 = case(rows, dtype, g)
        forced = torch.randint(0, 256, (rows, 4), generator=g)
        calls.clear()
        attention_calls.clear()
        gemms.clear()
        add_norms.clear()
        codes_k, logits_k = run(cp, h, c0, True, forced)
        assert len(calls) == 4, "the kernel path did not run"
        assert len(attention_calls) == 2 * 3, "the fused norm/RoPE/attention kernel did not run (2 layers x 3 steps)"
        skinny = rows <= 4            # (the 2-token first step has 2 x rows tokens: <= SKINNY_MAX_ROWS up to 4)
        # o_proj (128 -> 64, residual) in every layer and step; down_proj with silu*up only at one row, 3 steps
        assert gemms.count(((64, 128), False)) == (2 * 4 if skinny else 0)
        assert gemms.count(((64, 128), True)) == (2 * 3 if rows == 1 else 0)
        # above the skinny sizes, per stack call (4): each layer's post-attention add + norm, the first layer's
        # MLP output added in the second layer's input norm, the second's in the final norm
        assert len(add_norms) == (0 if skinny else 4 * (2 + 1 + 1))
        codes_r, logits_r = run(cp, h, c0, False, forced)
        assert torch.equal(codes_k, forced) and torch.equal(codes_r, forced)
        assert_logits_close(logits_k, logits_r, tol, dtype)
        if dtype == torch.float32 and rows == 1:     # (greedy: one row is enough; the logits above hold the rest)
            greedy_k, _ = run(cp, h, c0, True, None)
            greedy_r, _ = run(cp, h, c0, False, None)
            assert torch.equal(greedy_k, greedy_r)
    CodePredictor._kernel_step_logits = real
    fused_attention.norm_rope_attend_append = real_attention
    sk.skinny_linear = real_skinny
    layer_mod.add_rms_norm = real_add_norm
    cp_mod.CP_SPLIT_PREFILL = saved_split


def check_one_row_norm_linear_layers_against_reference():
    """qwen3_layer.ONE_ROW_NORM_LINEAR (the per-layer path at one row with the norms folded into q|k|v and gate|up,
    voxflow/kernels/norm_linear.py): taken on every single-token step (2 norm_linear launches a layer, no
    silu * up prologue left on down_proj), logits within the tolerances above, greedy codes equal in fp32."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import norm_linear as nl
    from voxflow.kernels import skinny_linear as sk
    calls, gated = [], []
    real_nl, real_sk, real_config = nl.norm_linear, sk.skinny_linear, nl.launch_config
    nl.norm_linear = lambda *a, **kw: (calls.append(kw.get("swiglu", False)), real_nl(*a, **kw))[1]
    sk.skinny_linear = lambda *a, **kw: (gated.append(kw.get("gated", False)), real_sk(*a, **kw))[1]
    # Few wide programs: the interpreter's cost is per program (the GPU configs: tests/test_kernel_cp_layer.py).
    nl.launch_config = lambda *a, **kw: {**real_config(*a, **kw), "BLOCK_N": 64}
    saved = layer_mod.ONE_ROW_NORM_LINEAR, cp_mod.CP_FUSED_LAYER, cp_mod.CP_SPLIT_PREFILL
    # (CP_SPLIT_PREFILL held off: the counts below take the 2-token first step on the per-layer path)
    layer_mod.ONE_ROW_NORM_LINEAR, cp_mod.CP_FUSED_LAYER, cp_mod.CP_SPLIT_PREFILL = True, False, False
    try:
        g = torch.Generator().manual_seed(4)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
            cp, h, c0 = case(1, dtype, g)
            codes_r, logits_r = run(cp, h, c0, False, None)
            calls.clear()
            gated.clear()
            # the reference's own codes fed back (teacher-forced), so both paths see the same inputs at every step
            codes_k, logits_k = run(cp, h, c0, True, codes_r)
            assert calls.count(False) == 2 * 3 and calls.count(True) == 2 * 3    # 2 layers x 3 single-token steps
            assert not any(gated), "down_proj took the silu * up prologue on the one-row path"
            assert_logits_close(logits_k, logits_r, tol, dtype)
            if dtype == torch.float32:          # and left to itself, the kernel path draws the same greedy codes
                assert torch.equal(logits_k.argmax(-1), codes_r)
    finally:
        nl.norm_linear, sk.skinny_linear, nl.launch_config = real_nl, real_sk, real_config
        layer_mod.ONE_ROW_NORM_LINEAR, cp_mod.CP_FUSED_LAYER, cp_mod.CP_SPLIT_PREFILL = saved


def check_draw_and_embed_changes_no_bits():
    """batch_sampling's draw_and_embed (the draw copies the drawn code's embedding row, no lookup launch): taken on
    every one of the frame's draws (counted), and the same codes and frame embedding, bit for bit, as the lookups
    it replaces (the same sample function without it), bf16, one row (c=1's path)."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import select_tokens as fused
    from voxflow.models.qwen3_tts.sampling import WarpParams
    from voxflow.kernels import cp_layer, norm_linear as nl, skinny_linear as sk
    mods = (layer_mod, cache_mod, cp_mod, bs)
    saved = [m.use_kernels for m in mods]
    saved_configs, real_config = dict(cp_layer.CONFIGS), nl.launch_config
    embeds, real = [], fused.select_tokens
    fused.select_tokens = lambda *a, **kw: (embeds.append(kw.get("embed") is not None), real(*a, **kw))[1]
    for m in mods:
        m.use_kernels = lambda t: True
    # Few wide programs: the interpreter's cost is per program (the kernel tests cover the GPU configs).
    cp_layer.CONFIGS.update(qkv=dict(BLOCK_N=64), attention_o_proj=dict(BLOCK_N=64), gate_up=dict(BLOCK_N=64),
                            lm_head=dict(BLOCK_N=64))
    nl.launch_config = lambda *a, **kw: {**real_config(*a, **kw), "BLOCK_N": 64}
    real_skinny_config = sk.launch_config
    sk.launch_config = lambda *a, **kw: {**real_skinny_config(*a, **kw), "BLOCK_N": 64}
    saved_tables = cp_mod.PROJECTED_TABLES
    try:
        cp = small_code_predictor(torch.bfloat16)
        g = torch.Generator().manual_seed(6)
        h = torch.randn(1, 96, generator=g).to(torch.bfloat16)
        c0 = torch.randn(1, 96, generator=g).to(torch.bfloat16)
        keys, frame = torch.tensor([12345]), torch.tensor([7])
        # (greedy: sampling rows copy their rows the same way, tests/test_kernel_select_tokens.py)
        params = WarpParams(torch.tensor([False]), torch.tensor([0.9]), torch.tensor([20]),
                            torch.tensor([1.0], dtype=torch.float64), any_top_p=False)
        sample_fn = bs.residual_sample_fn(params, keys, frame, False)
        cp_mod.PROJECTED_TABLES = False          # (the projected inputs: check_projected_tables_against_reference)
        codes, frame_embed = cp.predict(h, c0, sample_fn, frame_embed=True)
        assert embeds == [True] * 4, embeds                      # every draw copied its row
        without = cp.predict(h, c0, lambda logits, j: sample_fn(logits, j), frame_embed=True)
        assert embeds[4:] == [False] * 4
        assert torch.equal(codes, without[0]) and torch.equal(frame_embed, without[1])
        _assert_embed_parts_are_the_frames_rows(cp, h, c0, sample_fn, codes, frame_embed)
    finally:
        cp_mod.PROJECTED_TABLES = saved_tables
        fused.select_tokens, nl.launch_config, sk.launch_config = real, real_config, real_skinny_config
        cp_layer.CONFIGS.update(saved_configs)
        for m, f in zip(mods, saved):
            m.use_kernels = f


def _assert_embed_parts_are_the_frames_rows(cp, h, c0, sample_fn, codes, frame_embed):
    """predict's embed_parts (the fused talker-input kernel sums them, kernels/frame_input.py): the draws wrote the
    15 codes' rows into the buffer, so the same codes come out and c0's row + rows [1:] sum to the frame embedding,
    bit for bit (the same rows, stacked in the same order)."""
    codes_p, parts = cp.predict(h, c0, sample_fn, frame_embed=True, embed_parts=True)
    assert isinstance(parts, tuple), "embed_parts was not taken"
    first, rows = parts
    assert torch.equal(codes_p, codes) and rows.shape == (h.shape[0], 5, c0.shape[1])
    assert torch.equal(torch.cat((first[:, None], rows[:, 1:]), dim=1).sum(dim=1), frame_embed)


def check_projected_tables_against_reference():
    """code_predictor.PROJECTED_TABLES (on by default, forced on here; the small model has a projection, as the 1.7B
    one): the tables are the projection of every input table's rows; on the kernel path with the fused draws every
    draw but the last copies the projected row too (select_tokens' embed2, spied), no projection GEMM runs after the
    first step (skinny_linear with a bias, spied: the 2-token step's only), and fp32 greedy codes and the frame
    embedding equal the reference path's (kernels off, plain argmax draws, its own lookups and projections)."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_layer, norm_linear as nl, skinny_linear as sk
    from voxflow.kernels import select_tokens as fused
    from voxflow.models.qwen3_tts.sampling import WarpParams
    mods = (layer_mod, cache_mod, cp_mod, bs)
    saved = [m.use_kernels for m in mods]
    saved_configs, real_config, real_skinny_config = dict(cp_layer.CONFIGS), nl.launch_config, sk.launch_config
    real_select, real_skinny = fused.select_tokens, sk.skinny_linear
    second, biased = [], []
    fused.select_tokens = lambda *a, **kw: (second.append(kw.get("embed2") is not None), real_select(*a, **kw))[1]
    sk.skinny_linear = lambda *a, **kw: (biased.append(kw.get("bias") is not None), real_skinny(*a, **kw))[1]
    # Few wide programs: the interpreter's cost is per program (the kernel tests cover the GPU configs).
    cp_layer.CONFIGS.update(qkv=dict(BLOCK_N=64), attention_o_proj=dict(BLOCK_N=64), gate_up=dict(BLOCK_N=64),
                            lm_head=dict(BLOCK_N=64))
    nl.launch_config = lambda *a, **kw: {**real_config(*a, **kw), "BLOCK_N": 64}
    sk.launch_config = lambda *a, **kw: {**real_skinny_config(*a, **kw), "BLOCK_N": 64}
    saved_tables, cp_mod.PROJECTED_TABLES = cp_mod.PROJECTED_TABLES, True        # (whatever the environment says)
    try:
        cp = small_code_predictor(torch.float32)
        with torch.no_grad():
            tables = cp.projected_tables()
            for j in range(3):
                assert torch.equal(tables[j], cp.small_to_mtp_projection(cp.model.codec_embedding[j].weight))
        g = torch.Generator().manual_seed(8)
        h, c0 = torch.randn(1, 96, generator=g), torch.randn(1, 96, generator=g)
        params = WarpParams(torch.tensor([False]), torch.tensor([0.9]), torch.tensor([20]),
                            torch.tensor([1.0], dtype=torch.float64), any_top_p=False)
        for m in mods:
            m.use_kernels = lambda t: True
        codes, frame_embed = cp.predict(h, c0, bs.residual_sample_fn(params, torch.tensor([1]), torch.tensor([3]),
                                                                     False), frame_embed=True)
        assert second == [True, True, True, False], second       # steps 1..3 take projected rows; the last none
        assert biased.count(True) == 1, biased                   # the 2-token step's projection only
        for m in mods:
            m.use_kernels = lambda t: False
        want, want_embed = cp.predict(h, c0, lambda logits, j: logits.argmax(-1), frame_embed=True)
        assert torch.equal(codes, want)
        assert torch.allclose(frame_embed, want_embed, rtol=0, atol=0), "the frame embedding sums the same rows"
        for m in mods:
            m.use_kernels = lambda t: True
        _assert_embed_parts_are_the_frames_rows(
            cp, h, c0, bs.residual_sample_fn(params, torch.tensor([1]), torch.tensor([3]), False), codes, frame_embed)
    finally:
        cp_mod.PROJECTED_TABLES = saved_tables
        fused.select_tokens, sk.skinny_linear = real_select, real_skinny
        nl.launch_config, sk.launch_config = real_config, real_skinny_config
        cp_layer.CONFIGS.update(saved_configs)
        for m, f in zip(mods, saved):
            m.use_kernels = f


def check_deferred_residual_adds_change_no_bits():
    """Qwen3DecoderStack on the kernel path above the skinny sizes: each layer's MLP output added inside the next
    norm's kernel (forward_deferred) gives the same bits as adding it first and normalising after (layer.forward
    chained, then the final norm), fp32 and bf16, with and without the final norm."""
    from voxflow.layers import qwen3_layer as layer_mod
    from voxflow.layers import rms_norm as norm_mod
    from voxflow.layers.attention import attention_bias
    from voxflow.kernels import rms_norm as fused
    saved = layer_mod.use_kernels, norm_mod.use_kernels, fused.add_rms_norm
    layer_mod.use_kernels = norm_mod.use_kernels = lambda t: True       # the RMSNorm kernels too (interpreted)
    kernel_calls = []
    fused.add_rms_norm = lambda *a: (kernel_calls.append(1), saved[2](*a))[1]
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)                   # (the kernels leave anything autograd must see to torch)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            stack = small_code_predictor(dtype).model
            x = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
            positions = torch.arange(4).expand(3, 4)
            cos, sin = stack.rotary(positions, dtype)
            causal = attention_bias(4, 4, None, batch=3, dtype=dtype, device=x.device)     # as the stack builds it
            chained = x
            for layer in stack.layers:
                chained = layer(chained, cos, sin, None, causal)
            assert torch.equal(stack(x, positions, final_norm=False), chained), dtype
            assert torch.equal(stack(x, positions), stack.norm(chained)), dtype
        assert kernel_calls, "the fused add + RMSNorm kernel did not run"
    finally:
        layer_mod.use_kernels, norm_mod.use_kernels, fused.add_rms_norm = saved
        torch.set_grad_enabled(grad)


def check_fused_layer_path_against_reference():
    """The four-kernel layer path (voxflow/kernels/cp_layer.py, CP_FUSED_LAYER on) and the one-pass norm + lm_head:
    taken on every single-token step, and on the 2-token first step position by position (CP_FUSED_PREFILL; off:
    the per-layer path there) (spied: layer_step per layer and step, and neither the per-layer attention kernel nor
    the skinny norm prologue on those steps), logits within the same tolerances as above, greedy codes
    equal to the reference's in fp32 and bf16. One row, and three rows with the row limit raised."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import attention_o_proj, cp_layer, norm_linear
    from voxflow.kernels import dense_decode_norm_rope as fused_attention
    from voxflow.kernels import skinny_linear as sk
    spies = {"layer_step": [], "attention_o_proj": [], "norm_linear": [], "per_layer_attention": [], "skinny": [],
             "layer_append": []}
    patched = [(cp_layer, "layer_step"), (attention_o_proj, "attention_o_proj"), (norm_linear, "norm_linear"),
               (fused_attention, "norm_rope_attend_append"), (sk, "skinny_linear"), (cp_layer, "layer_append")]
    saved = [getattr(m, name) for m, name in patched] + [cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_MAX_ROWS,
                                                         cp_mod.CP_NORM_LINEAR_LM_HEAD, cp_mod.CP_FUSED_PREFILL,
                                                         cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL]
    saved_configs = dict(cp_layer.CONFIGS)

    def spy(key, real):
        def wrapper(*a, **kw):
            spies[key].append((kw.get("swiglu", False), kw.get("gated", False), kw.get("norm_weight") is not None,
                               kw.get("bias") is not None))
            return real(*a, **kw)
        return wrapper
    for (m, name), key, real in zip(patched, spies, saved):
        setattr(m, name, spy(key, real))
    # (CP_SPLIT_PREFILL off: the case without the fused prefill counts the per-layer path's launches; CP_JOINT_PREFILL
    # off: the fused prefill position by position, the joint pass being check_joint_prefill_at_one_row's)
    cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_MAX_ROWS, cp_mod.CP_SPLIT_PREFILL = True, 4, False
    cp_mod.CP_JOINT_PREFILL = False
    # Few wide programs: the interpreter's cost is per program (the kernel tests cover the GPU configs).
    cp_layer.CONFIGS.update(qkv=dict(BLOCK_N=64), attention_o_proj=dict(BLOCK_N=64), gate_up=dict(BLOCK_N=64),
                            lm_head=dict(BLOCK_N=64))
    try:
        g = torch.Generator().manual_seed(2)
        # (lm_head after the fused layers: skinny_linear's norm prologue, or norm_linear with the switch on; the
        # 2-token first step through the fused layers too, CP_FUSED_PREFILL, or the per-layer path)
        for rows, dtype, tol, nl_head, prefill in ((1, torch.float32, 1e-4, False, True),
                                                   (1, torch.bfloat16, 5e-2, True, True),
                                                   (3, torch.float32, 1e-4, True, True),
                                                   (1, torch.float32, 1e-4, False, False)):
            cp_mod.CP_NORM_LINEAR_LM_HEAD, cp_mod.CP_FUSED_PREFILL = nl_head, prefill
            cp, h, c0 = case(rows, dtype, g)
            for v in spies.values():
                v.clear()
            codes_k, logits_k = run(cp, h, c0, True, None)
            steps = 3                                     # 4 code groups: a 2-token prefill, then 3 single-token steps
            # the fused prefill: position 0 through layer 0, then only its keys / values appended in layer 1
            # (layer_append: K1 + K2), position 1 through both layers
            full, appends = 2 * steps + (3 if prefill else 0), (1 if prefill else 0)
            assert len(spies["layer_step"]) == full, "the fused layer path did not run where it should"
            assert len(spies["layer_append"]) == appends
            assert len(spies["attention_o_proj"]) == full + appends
            # per layer step: q|k|v and gate|up (swiglu); per fused step: lm_head (switch on)
            heads = steps + (1 if prefill else 0)
            assert spies["norm_linear"].count((True, False, False, False)) == full
            assert spies["norm_linear"].count((False, False, False, False)) == full + appends + (
                heads if nl_head else 0)
            assert not spies["per_layer_attention"], "the per-layer attention kernel ran on a single-token step"
            # skinny: down_proj + residual per layer step (plain, its input made by gate|up's kernel); without the
            # fused prefill the prefill's o_proj per layer (2 tokens: no silu*up prologue on its down_proj);
            # (one row) lm_head with the norm prologue (the fused steps' too with the switch off, and the
            # per-layer prefill's); the input projection (bias) on every step
            skinny = spies["skinny"]
            plain = full + (0 if prefill else 2)
            assert skinny.count((False, False, False, False)) == plain
            assert skinny.count((False, True, False, False)) == 0
            head_prologue = ((0 if nl_head else heads) + (0 if prefill else 1)) if rows == 1 else 0
            assert skinny.count((False, False, True, False)) == head_prologue
            prefill_bias = 1 if 2 * rows <= cp_mod.SKINNY_BIAS_MAX_ROWS else 0
            assert skinny.count((False, False, False, True)) == steps + prefill_bias
            assert len(skinny) == plain + steps + prefill_bias + head_prologue
            # greedy on both paths: equal codes mean both saw the same inputs at every step, so the logits compare
            codes_r, logits_r = run(cp, h, c0, False, None)
            assert torch.equal(codes_k, codes_r), (rows, dtype)
            assert_logits_close(logits_k, logits_r, tol, rows, dtype)
    finally:
        for (m, name), real in zip(patched, saved):
            setattr(m, name, real)
        (cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_MAX_ROWS, cp_mod.CP_NORM_LINEAR_LM_HEAD,
         cp_mod.CP_FUSED_PREFILL, cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL) = saved[-6:]
        cp_layer.CONFIGS.update(saved_configs)


def check_owned_inputs_change_no_bits():
    """code_predictor.OWNED_INPUT at nine rows (the folded layers) with the fused draws: a code predictor without a
    projection (the 0.6B's case: every draw but the last copies the raw row a second time, select_tokens' embed2,
    spied) and one with (the 1.7B's: the projected table rows). Each single-token step's first layer adds into its
    input in place (x_owned, spied; the 2-token first step's pieces too: copies at nine rows), and the codes and the
    frame embedding are bit for bit those with it off, greedy fp32 and sampled bf16; the input and projected tables
    are unchanged. (The split first step, CP_JOINT_PREFILL held off: check_joint_prefill_against_reference holds
    the joint pass's in-place add to the split path's bits.)"""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import select_tokens as fused
    from voxflow.models.qwen3_tts.sampling import WarpParams
    mods = (layer_mod, cache_mod, cp_mod, bs)
    saved = [m.use_kernels for m in mods]
    saved_switches = cp_mod.OWNED_INPUT, cp_mod.PROJECTED_TABLES, cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL
    real_select, real_folded = fused.select_tokens, layer_mod.Qwen3DecoderLayer._forward_folded
    second, owned = [], []
    fused.select_tokens = lambda *a, **kw: (second.append(kw.get("embed2") is not None), real_select(*a, **kw))[1]
    layer_mod.Qwen3DecoderLayer._forward_folded = lambda self, x, cos, sin, cache, x_owned: (
        owned.append(x_owned), real_folded(self, x, cos, sin, cache, x_owned))[1]
    # (whatever the environment says)
    cp_mod.PROJECTED_TABLES, cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL = True, True, False
    for m in mods:
        m.use_kernels = lambda t: True
    try:
        g = torch.Generator().manual_seed(10)
        for talker, dtype, do_sample in ((64, torch.float32, False), (96, torch.float32, False),
                                         (64, torch.bfloat16, True)):
            cp = small_code_predictor(dtype, talker)
            h = torch.randn(9, talker, generator=g).to(dtype)
            c0 = torch.randn(9, talker, generator=g).to(dtype)
            params = WarpParams(torch.full((9,), do_sample), torch.full((9,), 0.9), torch.full((9,), 20),
                                torch.full((9,), 1.0, dtype=torch.float64), any_top_p=do_sample)
            inputs = [t.weight.clone() for t in cp.model.codec_embedding]
            results = []
            for on in (True, False):
                cp_mod.OWNED_INPUT = on
                second.clear(), owned.clear()
                sample_fn = bs.residual_sample_fn(params, torch.arange(9) + 5, torch.full((9,), 3), do_sample)
                with torch.no_grad():
                    results.append(cp.predict(h, c0, sample_fn, frame_embed=True))
                # layer 0 of the 2 prefill pieces (copies of the step's rows at nine rows), then of the 3
                # single-token steps; layer 1 always its own
                assert owned[0::2] == [on] * 5 and all(owned[1::2]), (talker, on, owned)
                if talker == 64:
                    assert second == [on] * 3 + [False], (on, second)
            assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
            if talker == 96:
                # the engine's form with a projection: the draws write the frame's rows into one buffer (embed_parts)
                # beside the owned projected rows; its rows sum to the same frame embedding
                cp_mod.OWNED_INPUT = True
                sample_fn = bs.residual_sample_fn(params, torch.arange(9) + 5, torch.full((9,), 3), do_sample)
                with torch.no_grad():
                    codes_p, (first, rows) = cp.predict(h, c0, sample_fn, frame_embed=True, embed_parts=True)
                assert torch.equal(codes_p, results[1][0])
                assert torch.equal(torch.cat((first[:, None], rows[:, 1:]), dim=1).sum(dim=1), results[1][1])
            assert all(torch.equal(t.weight, w) for t, w in zip(cp.model.codec_embedding, inputs))
            if talker == 96:
                with torch.no_grad():
                    tables = cp.projected_tables()
                    for j in range(3):
                        assert torch.equal(tables[j], cp.small_to_mtp_projection(cp.model.codec_embedding[j].weight))
    finally:
        fused.select_tokens, layer_mod.Qwen3DecoderLayer._forward_folded = real_select, real_folded
        cp_mod.OWNED_INPUT, cp_mod.PROJECTED_TABLES, cp_mod.CP_SPLIT_PREFILL, cp_mod.CP_JOINT_PREFILL = saved_switches
        for m, f in zip(mods, saved):
            m.use_kernels = f


def check_folded_head_against_reference():
    """code_predictor.CP_FOLDED_HEAD at nine rows with the fused draws: folded_norms.fold_final_norm_in_place keeps
    the reference path's function (its logits within the module's tolerance before and after the fold, fp32), and
    with it on every draw gets the stack's un-normed rows to scale by (select_tokens' row_scale, spied), the final
    norm never runs (spied), each draw's scaled logits (folded_norms.scale_rows, what the kernel does) are the
    head's logits of the normed rows within 1e-5 (fp32) / two bf16 roundings of max |logit|, and fp32 greedy codes
    and the frame embedding equal those with it off. (bf16 sampled codes are not compared: one rounding apart,
    a flipped draw changes every later input of its row.) With qwen3_layer.SKINNY_HEADS too: the 4 heads' GEMMs run on
    skinny_linear (spied), the same tolerances, the same fp32 codes and frame embedding."""
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import skinny_linear as sk
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import select_tokens as fused
    from voxflow.layers.folded_norms import fold_final_norm_in_place, scale_rows
    from voxflow.models.qwen3_tts.sampling import WarpParams
    mods = (layer_mod, cache_mod, cp_mod, bs)
    saved = [m.use_kernels for m in mods]
    saved_switch, saved_heads = cp_mod.CP_FOLDED_HEAD, layer_mod.SKINNY_HEADS
    real_select, real_skinny = fused.select_tokens, sk.skinny_linear
    scaled, norms, draws, heads = [], [], [], []
    sk.skinny_linear = lambda x, w, **kw: (heads.append(w.shape[0] == 256), real_skinny(x, w, **kw))[1]
    fused.select_tokens = lambda *a, **kw: (scaled.append(kw.get("row_scale") is not None),
                                            draws.append((a[0], a[7], kw.get("row_scale"))), real_select(*a, **kw))[2]
    try:
        g = torch.Generator().manual_seed(14)
        for dtype, do_sample in ((torch.float32, False), (torch.bfloat16, True)):
            cp = small_code_predictor(dtype, 64)
            h = torch.randn(9, 64, generator=g).to(dtype)
            c0 = torch.randn(9, 64, generator=g).to(dtype)
            if dtype == torch.float32:
                _, before = run(cp, h, c0, False, None)
            fold_final_norm_in_place(cp.model.norm, cp.lm_head)
            assert torch.equal(cp.model.norm.weight, torch.ones_like(cp.model.norm.weight))
            if dtype == torch.float32:
                _, after = run(cp, h, c0, False, None)
                assert_logits_close(after, before, 1e-5, "fold")
            real_norm = cp.model.norm.forward
            cp.model.norm.forward = lambda x: (norms.append(1), real_norm(x))[1]
            params = WarpParams(torch.full((9,), do_sample), torch.full((9,), 0.9), torch.full((9,), 20),
                                torch.full((9,), 1.0, dtype=torch.float64), any_top_p=do_sample)
            for m in mods:
                m.use_kernels = lambda t: True
            results = []
            # (the layers' GEMMs stay on cuBLAS: CP_SKINNY_GEMMS' "auto" finds no PDL on the CPU)
            for on, skinny_heads in ((True, False), (False, False), (True, True)):
                cp_mod.CP_FOLDED_HEAD, layer_mod.SKINNY_HEADS = on, skinny_heads
                scaled.clear(), norms.clear(), draws.clear(), heads.clear()
                sample_fn = bs.residual_sample_fn(params, torch.arange(9) + 5, torch.full((9,), 3), do_sample)
                with torch.no_grad():
                    results.append(cp.predict(h, c0, sample_fn, frame_embed=True))
                assert scaled == [on] * 4 and (len(norms) == 0) == on, (on, scaled, len(norms))
                assert heads == [True] * (4 if skinny_heads else 0), (skinny_heads, heads)
                for logits, codebook, row_scale in draws if on else ():
                    rows, eps = row_scale
                    with torch.no_grad():
                        want = cp.lm_head[codebook - 1](real_norm(rows)).float()
                    got = scale_rows(logits, rows, eps).float()
                    tol = 1e-5 if dtype == torch.float32 else 2 * 2.0 ** -8
                    assert (got - want).abs().max().item() <= tol * want.abs().max().item(), (dtype, codebook)
            for m, f in zip(mods, saved):
                m.use_kernels = f
            if dtype == torch.float32:
                for other in results[1:]:
                    assert torch.equal(results[0][0], other[0]) and torch.equal(results[0][1], other[1])
    finally:
        fused.select_tokens, cp_mod.CP_FOLDED_HEAD, layer_mod.SKINNY_HEADS = real_select, saved_switch, saved_heads
        sk.skinny_linear = real_skinny
        for m, f in zip(mods, saved):
            m.use_kernels = f


def engine_call_joint_vs_split(cp, h, c0, spied: list, check) -> list:
    """cp.predict as the engine calls it (frame_embed, the fused draws, fp32 greedy, every kernel path on), with
    CP_JOINT_PREFILL on then off; `spied` is cleared before each run and check(on) called after it -> the two
    (codes, frame embedding) results, on first."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.batch_sampling as bs
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.models.qwen3_tts.sampling import WarpParams
    rows = h.shape[0]
    params = WarpParams(torch.full((rows,), False), torch.full((rows,), 0.9), torch.full((rows,), 20),
                        torch.full((rows,), 1.0, dtype=torch.float64), any_top_p=False)
    mods = (layer_mod, cache_mod, cp_mod, bs)
    saved = [m.use_kernels for m in mods] + [cp_mod.CP_JOINT_PREFILL]
    for m in mods:
        m.use_kernels = lambda t: True
    results = []
    try:
        for on in (True, False):
            cp_mod.CP_JOINT_PREFILL = on
            spied.clear()
            sample_fn = bs.residual_sample_fn(params, torch.arange(rows) + 5, torch.full((rows,), 3), False)
            with torch.no_grad():
                results.append(cp.predict(h, c0, sample_fn, frame_embed=True))
            check(on)
    finally:
        for m, f in zip(mods, saved):
            m.use_kernels = f
        cp_mod.CP_JOINT_PREFILL = saved[-1]
    return results


def check_joint_prefill_against_reference():
    """code_predictor.CP_JOINT_PREFILL at twelve rows (the folded layers): the 2-token first step is one pass of 24
    rows, whose attention core takes both positions at once (S = 2, spied) -- two attention calls for the two
    layers instead of the split path's four, no eager attention -- and the logits stay within the module's
    tolerances of the reference, fp32 and bf16 (teacher-forced), with and without a projection (talker 96 / 64);
    fp32 greedy codes equal the reference's; where the attention core declines S = 2, the causal torch fallback
    (eager attention with a mask) gives the reference's codes too. The engine's call (frame_embed, the fused draws,
    the final norm folded into the heads so the draws scale the joint pass's strided last rows), fp32 greedy, with
    and without a projection (with one, the pass adds into the projection's output in place): the same codes and,
    bit for bit, the same frame embedding as the split path (which would differ if the pass had overwritten the c0
    rows it sums)."""
    import voxflow.layers.qwen3_layer as layer_mod
    import voxflow.layers.static_kv_cache as cache_mod
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import dense_decode_norm_rope as fused_attention
    from voxflow.layers.folded_norms import fold_final_norm_in_place
    new_tokens, eager = [], []
    real_attention, real_eager = fused_attention.norm_rope_attend_append, cache_mod.eager_attention
    fused_attention.norm_rope_attend_append = lambda *a, **kw: (new_tokens.append(a[0].shape[1]),
                                                                 real_attention(*a, **kw))[1]
    cache_mod.eager_attention = lambda *a: (eager.append(1), real_eager(*a))[1]
    saved = cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL
    assert layer_mod.FOLDED_NORMS
    rows = 12
    try:
        g = torch.Generator().manual_seed(11)
        for talker, dtype, tol in ((96, torch.float32, 1e-4), (64, torch.float32, 1e-4), (96, torch.bfloat16, 5e-2)):
            cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL = True, True
            cp = small_code_predictor(dtype, talker)
            h = torch.randn(rows, talker, generator=g).to(dtype)
            c0 = torch.randn(rows, talker, generator=g).to(dtype)
            codes_r, logits_r = run(cp, h, c0, False, None)
            new_tokens.clear(), eager.clear()
            codes_k, logits_k = run(cp, h, c0, True, None if dtype == torch.float32 else codes_r)
            if dtype == torch.float32:
                assert torch.equal(codes_k, codes_r)
            # 2 layers: the joint first step (S = 2), then 3 single-token steps
            assert new_tokens == [2, 2] + [1] * 6, new_tokens
            assert not eager
            assert_logits_close(logits_k, logits_r, tol, talker, dtype)
        # Where the attention core declines S = 2 (e.g. a head dim under its minimum), the folded layers' causal
        # torch fallback: eager attention with a mask on both layers, fp32 greedy codes still the reference's.
        real_supported = fused_attention.supported
        fused_attention.supported = lambda q, *a: q.shape[1] == 1 and real_supported(q, *a)
        try:
            cp = small_code_predictor(torch.float32, 64)
            h, c0 = torch.randn(rows, 64, generator=g), torch.randn(rows, 64, generator=g)
            codes_r, logits_r = run(cp, h, c0, False, None)
            eager.clear()
            codes_k, logits_k = run(cp, h, c0, True, None)
            assert torch.equal(codes_k, codes_r) and len(eager) == 2, len(eager)
            assert_logits_close(logits_k, logits_r, 1e-4, "fallback")
        finally:
            fused_attention.supported = real_supported
        # the engine's call: frame embedding, fused draws; joint against split
        for talker in (64, 96):
            cp = small_code_predictor(torch.float32, talker)
            fold_final_norm_in_place(cp.model.norm, cp.lm_head)
            h, c0 = torch.randn(rows, talker, generator=g), torch.randn(rows, talker, generator=g)

            def check(on):
                assert new_tokens[:2] == ([2, 2] if on else [1, 1]), (on, new_tokens)
            joint, split = engine_call_joint_vs_split(cp, h, c0, new_tokens, check)
            assert torch.equal(joint[0], split[0]) and torch.equal(joint[1], split[1]), talker
    finally:
        fused_attention.norm_rope_attend_append, cache_mod.eager_attention = real_attention, real_eager
        cp_mod.CP_JOINT_PREFILL, cp_mod.CP_SPLIT_PREFILL = saved


def check_joint_prefill_at_one_row():
    """code_predictor.CP_JOINT_PREFILL at one row (the four-kernel layers, CP_FUSED_LAYER): the 2-token first step
    as the two rows of one pass (cp_layer.layer_step with joint=True on both layers, spied; no layer_append), the
    logits within the module's tolerances of the reference (fp32 greedy: the same codes), with and without a
    projection; and the engine's call (frame_embed, fused draws), fp32 greedy: the same codes and frame embedding
    as the position-by-position fused prefill."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_layer
    joint, appends = [], []
    real_step, real_append = cp_layer.layer_step, cp_layer.layer_append
    cp_layer.layer_step = lambda *a, **kw: (joint.append(kw.get("joint", False)), real_step(*a, **kw))[1]
    cp_layer.layer_append = lambda *a, **kw: (appends.append(1), real_append(*a, **kw))[1]
    saved = cp_mod.CP_JOINT_PREFILL, cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_PREFILL, dict(cp_layer.CONFIGS)
    cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_PREFILL = True, True
    # Few wide programs: the interpreter's cost is per program (the kernel tests cover the GPU configs).
    cp_layer.CONFIGS.update(qkv=dict(BLOCK_N=64), attention_o_proj=dict(BLOCK_N=64), gate_up=dict(BLOCK_N=64))
    try:
        g = torch.Generator().manual_seed(12)
        for talker, dtype, tol in ((96, torch.float32, 1e-4), (64, torch.float32, 1e-4), (96, torch.bfloat16, 5e-2)):
            cp_mod.CP_JOINT_PREFILL = True
            cp = small_code_predictor(dtype, talker)
            h = torch.randn(1, talker, generator=g).to(dtype)
            c0 = torch.randn(1, talker, generator=g).to(dtype)
            codes_r, logits_r = run(cp, h, c0, False, None)
            joint.clear(), appends.clear()
            codes_k, logits_k = run(cp, h, c0, True, None if dtype == torch.float32 else codes_r)
            if dtype == torch.float32:
                assert torch.equal(codes_k, codes_r)
            assert joint == [True] * 2 + [False] * 6 and not appends, (joint, appends)
            assert_logits_close(logits_k, logits_r, tol, talker, dtype)
        for talker in (64, 96):
            cp = small_code_predictor(torch.float32, talker)
            h, c0 = torch.randn(1, talker, generator=g), torch.randn(1, talker, generator=g)

            def check(on):
                assert any(joint) == on, (on, joint)
            on, off = engine_call_joint_vs_split(cp, h, c0, joint, check)
            assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1]), talker
    finally:
        cp_layer.layer_step, cp_layer.layer_append = real_step, real_append
        cp_mod.CP_JOINT_PREFILL, cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_PREFILL = saved[:3]
        cp_layer.CONFIGS.clear()
        cp_layer.CONFIGS.update(saved[3])


if IN_CHILD:
    def test_child_kernel_path_against_reference():
        check_kernel_path_against_reference()

    def test_child_folded_norms_path_against_reference():
        check_folded_norms_path_against_reference()

    def test_child_fused_layer_path_against_reference():
        check_fused_layer_path_against_reference()

    def test_child_deferred_residual_adds_change_no_bits():
        check_deferred_residual_adds_change_no_bits()

    def test_child_draw_and_embed_changes_no_bits():
        check_draw_and_embed_changes_no_bits()

    def test_child_projected_tables_against_reference():
        check_projected_tables_against_reference()

    def test_child_one_row_norm_linear_layers_against_reference():
        check_one_row_norm_linear_layers_against_reference()

    def test_child_owned_inputs_change_no_bits():
        check_owned_inputs_change_no_bits()
    # (check_folded_head_against_reference, check_joint_prefill_against_reference,
    # check_joint_prefill_at_one_row and check_cp_skinny_gemms_against_reference run in
    # test_kernel_code_predictor_path_joint.py's own child: two workers)
else:
    def test_code_predictor_kernel_path_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
