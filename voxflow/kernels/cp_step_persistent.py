"""A whole code-predictor decode step (every decoder layer, then the final norm + lm_head) in ONE persistent launch.

EXPERIMENTAL, off by default (voxflow/models/qwen3_tts/code_predictor.py's CP_PERSISTENT_STEP). The four-kernel
layer (cp_layer.py) still pays a launch and a ramp/tail per kernel: 4 x 5 + 1 = 21 a step. Here one grid of
`programs` (one per SM by default, so all are resident at once) runs the same phases back to back, separated by
grid-wide barriers:

    per layer:  q|k|v tiles (norm_linear)      -> barrier -> attention + o_proj tiles (attention_o_proj)
                -> barrier -> gate|up + silu * up tiles (norm_linear) -> barrier -> down + residual tiles
                (norm_linear without a norm) -> barrier
    then:       final norm + lm_head tiles (norm_linear)

Each phase is the @triton.jit tile function its stand-alone kernel calls (`_norm_linear_tile`,
`_attention_o_proj_tile`): a program loops over tiles pid, pid + P, ... So the math is what the interpreter tests
check through the phased (multi-launch) version, `cp_step_phased`, which launches those kernels one phase at a time
with the same tiles. Under the interpreter the persistent kernel itself runs only as a single program (programs run
one after another there, so with more a grid barrier would wait for programs that have not started); the CPU test
runs it so, the GPU test with the full grid, both against the phased version.

Barrier: each program, after a CTA barrier (its stores done), adds 1 to a global counter with release semantics
and spins (acquire) until the counter reaches (phases so far) x P. Loads of data another program wrote in this
launch go through L2 only (cache_modifier ".cg": L1 is not coherent across SMs). The spin gives up after MAX_SPIN
polls and sets an error flag (sync[1]) instead of hanging the GPU, e.g. when not all programs are resident (the
result is then garbage: tests check the flag). The counter is zeroed by the host (one memset) before each launch.

Per-layer tensors: the kernel gets layer 0's pointers and an int64 table [L, 8] of element offsets from them to
layer i's (`layer_offsets`, made once per set of weights, outside any CUDA-graph capture); the KV caches are one
[L, B, Hkv, max_len, D] buffer each (StaticKVCache.k_all / v_all). Scratch (q|k|v, h, act rows) is allocated per
call; the input rows x are left unchanged (layer 0 reads them, every later phase a scratch copy of the stream).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import attention_o_proj as attn
from voxflow.kernels import cp_layer
from voxflow.kernels import norm_linear as nl
from voxflow.kernels.attention_o_proj import _attention_o_proj_tile
from voxflow.kernels.norm_linear import _norm_linear_tile

MAX_SPIN = 1 << 20
FIELDS = ("input_norm", "qkv", "q_norm", "k_norm", "o", "post_norm", "gate_up", "down")
# Tiles per phase (untuned guesses for one program per SM on an H200: ~128 tiles a phase at one row). programs:
# the grid (None: programs_per_sm x the SM count; all must be resident at once).
DEFAULT_CONFIG = dict(programs=None, programs_per_sm=1, num_warps=8, qkv_bn=32, qkv_bk=512, o_bn=64, o_bh=2,
                      gu_bn=16, gu_bk=512, down_bn=8, down_bk=1024, head_bn=16, head_bk=1024)


@triton.jit
def _grid_barrier(sync_ptr, target, MAX_SPIN: tl.constexpr):
    """Every program of the launch has arrived here (sync_ptr[0] counts arrivals) before any goes on."""
    tl.debug_barrier()                                              # this program's stores are done
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_xchg(sync_ptr + 1, 1)                             # gave up: flag it rather than hang
    tl.debug_barrier()


@triton.jit
def _at(base, offs_ptr, i):
    """base + offs_ptr[i] elements (a multiple of 16: the tensors are 16-element aligned, `layer_offsets` checks)."""
    return base + tl.multiple_of(tl.load(offs_ptr + i), 16)


@triton.jit
def _cp_step_kernel(rows_ptr, x_off, qkv_ptr, h_ptr, act_ptr, logits_ptr, sync_ptr, offs_ptr, ws_ptr, cnt_ptr,
                    in_norm_ptr, qkv_w_ptr, q_norm_ptr, k_norm_ptr, o_w_ptr, post_norm_ptr, gate_up_w_ptr, down_w_ptr,
                    kc_ptr, vc_ptr, head_norm_ptr, head_w_ptr, cos_ptr, sin_ptr,
                    M, T, H, I, V, h_float, in_eps, post_eps, head_eps, q_eps, k_eps, scale, inv_d,
                    s_rows, s_qkv, s_h, s_act, s_logits, cos_sb, sin_sb, sk_l, sk_b, sk_h, sk_t, sv_l, sv_b, sv_h, sv_t,
                    NUM_LAYERS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_T: tl.constexpr, PRECISE_EXP: tl.constexpr, BLOCK_M: tl.constexpr,
                    QKV_BN: tl.constexpr, QKV_BK: tl.constexpr, O_BN: tl.constexpr, O_BH: tl.constexpr,
                    GU_BN: tl.constexpr, GU_BK: tl.constexpr, DOWN_BN: tl.constexpr, DOWN_BK: tl.constexpr,
                    HEAD_BN: tl.constexpr, HEAD_BK: tl.constexpr, MAX_SPIN: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NQKV = (HQ + 2 * HKV) * D
    for layer in range(NUM_LAYERS):
        offs = offs_ptr + layer * 8
        barriers = layer * 4
        # the layer's input: the caller's rows x (at x_off elements from the scratch rows) for layer 0, then rows
        src = rows_ptr + tl.multiple_of(tl.where(layer == 0, x_off, 0), 16)
        for tile in range(pid, tl.cdiv(NQKV, QKV_BN), nprog):
            _norm_linear_tile(tile, src, _at(in_norm_ptr, offs, 0), _at(qkv_w_ptr, offs, 1), src, qkv_ptr,
                              M, NQKV, H, s_rows, s_rows, s_qkv, h_float, in_eps, True, False, False, PRECISE_EXP,
                              True, BLOCK_M, QKV_BN, QKV_BK)
        _grid_barrier(sync_ptr, (barriers + 1) * nprog, MAX_SPIN)
        for tile in range(pid, (HQ // O_BH) * tl.cdiv(H, O_BN), nprog):
            _attention_o_proj_tile(tile, qkv_ptr, src, _at(o_w_ptr, offs, 4), _at(q_norm_ptr, offs, 2),
                                   _at(k_norm_ptr, offs, 3), cos_ptr, sin_ptr, kc_ptr + layer * sk_l,
                                   vc_ptr + layer * sv_l, h_ptr, ws_ptr, cnt_ptr, M, H, T, scale, inv_d, q_eps, k_eps,
                                   s_qkv, s_rows, s_h, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, HQ, HKV, D,
                                   HALF, O_BH, BLOCK_T, O_BN, True)
        _grid_barrier(sync_ptr, (barriers + 2) * nprog, MAX_SPIN)
        for tile in range(pid, tl.cdiv(I, GU_BN), nprog):
            _norm_linear_tile(tile, h_ptr, _at(post_norm_ptr, offs, 5), _at(gate_up_w_ptr, offs, 6), h_ptr, act_ptr,
                              M, I, H, s_h, s_h, s_act, h_float, post_eps, True, True, False, PRECISE_EXP, True,
                              BLOCK_M, GU_BN, GU_BK)
        _grid_barrier(sync_ptr, (barriers + 3) * nprog, MAX_SPIN)
        for tile in range(pid, tl.cdiv(H, DOWN_BN), nprog):
            # rows <- h + act @ W_down^T (rows is free: this layer's phases 1-2 have read it)
            _norm_linear_tile(tile, act_ptr, act_ptr, _at(down_w_ptr, offs, 7), h_ptr, rows_ptr, M, H, I, s_act,
                              s_h, s_rows, h_float, 0.0, False, False, True, PRECISE_EXP, True, BLOCK_M, DOWN_BN,
                              DOWN_BK)
        _grid_barrier(sync_ptr, (barriers + 4) * nprog, MAX_SPIN)
    for tile in range(pid, tl.cdiv(V, HEAD_BN), nprog):
        _norm_linear_tile(tile, rows_ptr, head_norm_ptr, head_w_ptr, rows_ptr, logits_ptr, M, V, H, s_rows, s_rows,
                          s_logits, h_float, head_eps, True, False, False, PRECISE_EXP, True, BLOCK_M, HEAD_BN,
                          HEAD_BK)


def layer_offsets(weights: list[cp_layer.LayerWeights]) -> torch.Tensor | None:
    """int64 [L, 8] element offsets of each layer's tensors (FIELDS) from layer 0's, on their device; None when a
    tensor is not 16-element aligned relative to layer 0's (the kernel's loads assume it). Not CUDA-graph capturable
    (a host-to-device copy): make it once, outside."""
    base = [getattr(weights[0], f) for f in FIELDS]
    table = []
    for w in weights:
        row = []
        for f, b in zip(FIELDS, base):
            t = getattr(w, f)
            diff = t.data_ptr() - b.data_ptr()
            if t.shape != b.shape or t.dtype != b.dtype or diff % (16 * t.element_size()):
                return None
            row.append(diff // t.element_size())
        table.append(row)
    return torch.tensor(table, dtype=torch.int64, device=base[0].device)


def supported(rows: torch.Tensor, weights: list[cp_layer.LayerWeights], cache, cos: torch.Tensor, sin: torch.Tensor,
              head_w: torch.Tensor, head_norm: torch.Tensor) -> bool:
    """A CUDA step (the interpreter cannot run a grid barrier) the four-kernel layer takes at every layer, with
    layers of one shape and eps, 16-element aligned tensors, and the cache's shared buffers."""
    if not rows.is_cuda or not weights or len(weights) != len(cache.layers):
        return False
    k_all, v_all = getattr(cache, "k_all", None), getattr(cache, "v_all", None)
    if k_all is None or v_all is None or any(t.data_ptr() % 16 for t in (rows, head_w, head_norm, k_all, v_all)):
        return False
    w0 = weights[0]
    for w, c in zip(weights, cache.layers):
        if not cp_layer.supported(rows, w, cos, sin, c.k, c.v):
            return False
        if (w.input_eps, w.post_eps, w.q_eps, w.k_eps, w.num_heads, w.scale) != \
                (w0.input_eps, w0.post_eps, w0.q_eps, w0.k_eps, w0.num_heads, w0.scale):
            return False
    return nl.supported(rows, head_w, head_norm)


def _check_tiles(cfg: dict, h: int, inter: int) -> None:
    if h % cfg["qkv_bk"] or h % cfg["gu_bk"] or h % cfg["head_bk"] or inter % cfg["down_bk"]:
        raise ValueError(f"cp_step: BLOCK_K values {cfg} must divide K ({h}, {inter})")


def cp_step_persistent(x: torch.Tensor, weights: list[cp_layer.LayerWeights], offsets: torch.Tensor, cache,
                       length: int, cos: torch.Tensor, sin: torch.Tensor, head_w: torch.Tensor,
                       head_norm: torch.Tensor, head_eps: float, *, config: dict | None = None,
                       sync: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder layers on rows x [M, H] (one new token each, at cache position `length` of every layer; x is
    not written) and lm_head(norm(last layer's rows)) -> logits [M, V]. `offsets`: from
    `layer_offsets(weights)`; cache: a StaticKVCache (its layers' lengths are advanced). `sync`: an int32 [2]
    tensor to use as the barrier counter and error flag (zeroed here; read sync[1] afterwards to see a barrier
    that gave up)."""
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    m, h = x.shape
    w0 = weights[0]
    inter, n_qkv, vocab = w0.gate_up.shape[0] // 2, w0.qkv.shape[0], head_w.shape[0]
    _, _, hkv, max_len, d = cache.k_all.shape
    _check_tiles(cfg, h, inter)
    if not 0 <= length < max_len:
        raise ValueError(f"cp_step_persistent: cache of {max_len} positions has no room at position {length}")
    for c in cache.layers:
        if c.claim() != length:
            raise ValueError("cp_step_persistent: the layers' caches are not all at `length`")
    dev, dt = x.device, x.dtype
    rows = torch.empty(m, h, dtype=dt, device=dev)
    x_off = x.data_ptr() - rows.data_ptr()
    if x.stride(0) != rows.stride(0) or x_off % (16 * x.element_size()):
        x = x.contiguous() if x.stride(0) != h else x.clone()        # (a layout the offset trick cannot reach)
        x_off = x.data_ptr() - rows.data_ptr()
        if x_off % (16 * x.element_size()):
            raise ValueError("cp_step_persistent: the input rows are not 16-element aligned")
    qkv = torch.empty(m, n_qkv, dtype=dt, device=dev)
    hbuf = torch.empty(m, h, dtype=dt, device=dev)
    act = torch.empty(m, inter, dtype=dt, device=dev)
    logits = torch.empty(m, vocab, dtype=dt, device=dev)
    nhb = w0.num_heads // cfg["o_bh"]
    ws = torch.empty(m, nhb, h, dtype=torch.float32, device=dev)
    counters = attn.tile_counters(dev, triton.cdiv(h, cfg["o_bn"]))
    if sync is None:
        sync = torch.zeros(2, dtype=torch.int32, device=dev)
    else:
        sync.zero_()
    cos2, sin2 = cos.reshape(-1, d), sin.reshape(-1, d)
    programs = cfg["programs"] or torch.cuda.get_device_properties(dev).multi_processor_count * cfg["programs_per_sm"]
    k_all, v_all = cache.k_all, cache.v_all
    _cp_step_kernel[(programs,)](
        rows, x_off // x.element_size(), qkv, hbuf, act, logits, sync, offsets, ws, counters,
        w0.input_norm, w0.qkv, w0.q_norm, w0.k_norm, w0.o, w0.post_norm, w0.gate_up, w0.down,
        k_all, v_all, head_norm, head_w, cos2, sin2,
        m, length, h, inter, vocab, float(h), float(w0.input_eps), float(w0.post_eps), float(head_eps),
        float(w0.q_eps), float(w0.k_eps), float(w0.scale), 1.0 / d,
        rows.stride(0), qkv.stride(0), hbuf.stride(0), act.stride(0), logits.stride(0),
        cos2.stride(0) if cos2.shape[0] > 1 else 0, sin2.stride(0) if sin2.shape[0] > 1 else 0,
        k_all.stride(0), k_all.stride(1), k_all.stride(2), k_all.stride(3),
        v_all.stride(0), v_all.stride(1), v_all.stride(2), v_all.stride(3),
        NUM_LAYERS=len(weights), HQ=w0.num_heads, HKV=hkv, D=d, HALF=d // 2,
        BLOCK_T=max(16, triton.next_power_of_2(max_len)), PRECISE_EXP=x.is_cuda, BLOCK_M=triton.next_power_of_2(m),
        QKV_BN=cfg["qkv_bn"], QKV_BK=cfg["qkv_bk"], O_BN=cfg["o_bn"], O_BH=cfg["o_bh"], GU_BN=cfg["gu_bn"],
        GU_BK=cfg["gu_bk"], DOWN_BN=cfg["down_bn"], DOWN_BK=cfg["down_bk"], HEAD_BN=cfg["head_bn"],
        HEAD_BK=cfg["head_bk"], MAX_SPIN=MAX_SPIN, num_warps=cfg["num_warps"],
        enable_fp_fusion=False)   # attention_o_proj's norms / RoPE rounding (the phases share one kernel)
    return logits


def cp_step_phased(x: torch.Tensor, weights: list[cp_layer.LayerWeights], cache, length: int, cos: torch.Tensor,
                   sin: torch.Tensor, head_w: torch.Tensor, head_norm: torch.Tensor, head_eps: float, *,
                   config: dict | None = None) -> torch.Tensor:
    """What `cp_step_persistent` computes, one launch per phase (the stand-alone kernels over the same tile
    functions and tiles; runs under the interpreter): the reference its GPU test holds it to."""
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    rows = x.clone()
    _check_tiles(cfg, rows.shape[1], weights[0].gate_up.shape[0] // 2)
    for w, c in zip(weights, cache.layers):
        t = c.claim()
        if t != length:
            raise ValueError("cp_step_phased: the layers' caches are not all at `length`")
        qkv = nl.norm_linear(rows, w.qkv, w.input_norm, w.input_eps,
                             config=dict(BLOCK_N=cfg["qkv_bn"], BLOCK_K=cfg["qkv_bk"]))
        h = attn.attention_o_proj(qkv, rows, w.o, w.q_norm, w.k_norm, w.q_eps, w.k_eps, cos, sin, c.k, c.v, t,
                                  w.num_heads, w.scale, config=dict(BLOCK_N=cfg["o_bn"], BLOCK_H=cfg["o_bh"]))
        act = nl.norm_linear(h, w.gate_up, w.post_norm, w.post_eps, swiglu=True,
                             config=dict(BLOCK_N=cfg["gu_bn"], BLOCK_K=cfg["gu_bk"]))
        nl.norm_linear(act, w.down, None, 0.0, residual=h, out=rows,
                       config=dict(BLOCK_N=cfg["down_bn"], BLOCK_K=cfg["down_bk"]))
    return nl.norm_linear(rows, head_w, head_norm, head_eps, config=dict(BLOCK_N=cfg["head_bn"],
                                                                          BLOCK_K=cfg["head_bk"]))
