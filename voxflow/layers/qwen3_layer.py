"""The Qwen3 decoder layer and decoder stack shared by the talker (28 layers) and the code predictor (5).

Layer: x + attn(norm(x)), then h + swiglu(norm(h)). Attention projects q/k/v without bias, applies a
per-head RMSNorm to q and k (over head_dim, *before* RoPE), rotates, and attends with grouped KV heads.
State-dict names follow the checkpoints: `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`, `mlp.*`,
`input_layernorm`, `post_attention_layernorm`; a stack has `layers.N.*` and `norm`.

On CUDA (kernel switch on) fused kernels cut launches, same rounding points: q_norm + k_norm + RoPE in one
(voxflow/kernels/qk_norm_rope.py), each residual add + the norm after it in one (`add_rms_norm`: the
post-attention one inside a layer, the MLP's into the next layer's input norm, `forward_deferred`), and for decode
batches of a few rows the skinny GEMMs with the residual add / silu * up fused in (`_forward_skinny`); a cache
with `attend_raw` (the code predictor's) takes the raw projections and does norms, RoPE and attention itself, and
above the skinny sizes such a layer step runs with both norms folded into its GEMM weights (`_forward_folded`,
voxflow/layers/folded_norms.py). Everywhere else the plain torch code below runs unchanged.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels, use_pdl
from voxflow.layers.attention import KVCache, LayerKVCache, attention_bias, eager_attention
from voxflow.layers.fused_linear import fuse_weights, kept_fused
from voxflow.layers.mlp import SwiGLU
from voxflow.layers.rms_norm import RMSNorm, add_rms_norm
from voxflow.layers.rotary import RotaryEmbedding, apply_rotary

# Decode batches up to this many tokens take the skinny-GEMM layer path (kernels on); GEMMs with a fused prologue
# (down_proj's silu * up, the code predictor's norm + lm_head) only at one token (H200 timings: above these the
# per-program prologue recompute costs more than it saves, e.g. 57 us instead of ~6 for a down_proj at 64 rows).
SKINNY_MAX_ROWS = 8
MAX_SKINNY_GEMM_ROWS = 64               # (skinny_linear.MAX_M, without importing Triton here)
SKINNY_PROLOGUE_MAX_ROWS = 1
# One-row layers with the norms folded into q|k|v and into gate|up (voxflow/kernels/norm_linear.py, as the code
# predictor's fused layer does): two launches fewer a layer (the talker's 28 layers at c=1: 56 a step). ON: on an
# H200 at the 1.7B talker's widths a one-row layer step went 50.1 -> 44.3 us and HTTP c=1 RTF 0.052 -> 0.049
# (benchmarks/results/h200/2026-12-02-session11, call 1; tune_talker_one_row.py). VOXFLOW_ONE_ROW_NORM_LINEAR=0
# turns it off (rms_norm + cuBLAS for q|k|v and gate|up).
ONE_ROW_NORM_LINEAR = os.environ.get("VOXFLOW_ONE_ROW_NORM_LINEAR", "1") == "1"
# Single-token steps above the skinny sizes: both RMSNorms folded into the GEMMs after them and the residual adds
# into the GEMMs before them (voxflow/layers/folded_norms.py), two launches fewer a layer step. FOLDED_NORMS: through
# a cache that attends from raw projections (the code predictor's; H200, 1.7B, c=64 step 7.59 -> 7.37 ms,
# benchmarks/results/h200/2026-12-03-session17, call 3). VOXFLOW_FOLDED_NORMS=0 turns it off.
# FOLDED_NORMS_PAGED: also through the talker's paged cache (q / k / v scaled by qk_norm_rope); the talker's norms
# are then folded into its weights in place at load (engine_loader.py, folded_norms.fold_norms_in_place): no folded
# copies (they would be +0.55 GiB for the 0.6B talker). On by default since session 40 (H100, 0.6B c=64 in <= 8 GB:
# full-step median 5.91-5.94 -> 5.80-5.82 ms in three A/Bs, 700.0 -> 708.2 audio-s/s on average; 1.7B c=64 full
# steps 6.62 -> 6.53, throughput and 1.7B c=1 unchanged: benchmarks/results/h100/2026-12-05-session40). Session 17
# had measured it slower (1.7B c=64 6.51 -> 8.17 ms, never profiled) on a talker path since rebuilt.
# VOXFLOW_FOLDED_NORMS_PAGED=0 turns it off.
FOLDED_NORMS = os.environ.get("VOXFLOW_FOLDED_NORMS", "1") == "1"
FOLDED_NORMS_PAGED = os.environ.get("VOXFLOW_FOLDED_NORMS_PAGED", "1") == "1"
# The code predictor's folded layer steps with their four GEMMs on skinny_linear instead of cuBLAS, at most
# MAX_SKINNY_GEMM_ROWS rows: with PDL (Hopper) each starts while the kernel before it ends, which cuBLAS's GEMM
# kernels cannot (session 58: no griddepcontrol in their SASS). ON since session 59 (an H100, 0.6B c=64 over HTTP in
# <= 8 GB, alternating: 787.5 / 785.3 / 785.8 audio-s/s against 759.8 / 759.8 / 744.8 / 757.3 with cuBLAS, full
# steps free of prefill 5.95-5.99 against 6.15-6.22 ms; a layer pass's four GEMMs alone 28.2 against 31.3-31.7 us:
# benchmarks/results/h100/2026-12-07-session59). Session 25 had measured such a step faster alone but not served,
# on a talker and codec since rebuilt. Values: "auto" (the default: where the kernels launch with PDL, the only
# setting measured; without PDL the chain was 2.5-3.6% faster than cuBLAS's on the H100, never served), "1" (always),
# "0" (never). The module value is True, False or "auto".
_SWITCH_VALUES = {"1": True, "0": False, "auto": "auto"}
CP_SKINNY_GEMMS = _SWITCH_VALUES.get(os.environ.get("VOXFLOW_CP_SKINNY_GEMMS", "auto"), "auto")
# The same for the talker's folded layer steps through its paged view (the 0.6B talker's layers have the code
# predictor's widths; the 1.7B's are twice as wide). OFF: session 61 (an H100, 0.6B c=64 over HTTP in <= 8 GB,
# alternating) measured its full steps 0.1 ms slower (5.40-5.41 against 5.29-5.32 ms) and 785.9-794.4 audio-s/s
# against 794.4-797.9. VOXFLOW_TALKER_SKINNY_GEMMS=1 (or auto) turns it on.
TALKER_SKINNY_GEMMS = _SWITCH_VALUES.get(os.environ.get("VOXFLOW_TALKER_SKINNY_GEMMS", "0"), False)
# The heads after those steps on skinny_linear too: the code predictor's 15 heads on its folded steps' un-normed rows
# (CP_FOLDED_HEAD, 9..64 rows) and the talker's codec_head at 2..64 rows (one row has SKINNY_CODEC_HEAD), 16 GEMMs a
# frame step that PDL lets start while the kernel before them ends, and the token draw after them start early. ON
# ("auto", as CP_SKINNY_GEMMS) since session 61: an H100, 0.6B c=64 over HTTP in <= 8 GB, alternating with the
# defaults of the day, full steps free of codec and prefill work 5.33 / 5.33 / 5.34 ms (median) against
# 5.37-5.39 over four runs (audio-s/s 752.5 / 777.4 / 777.6 against 766.4-771.8: the same mean); with the split-K
# below on a second machine, 794.4-797.9 against 784.0 / 788.5 without both (+1.3%);
# benchmarks/results/h100/2026-12-07-session61. VOXFLOW_SKINNY_HEADS=0 turns it off.
SKINNY_HEADS = _SWITCH_VALUES.get(os.environ.get("VOXFLOW_SKINNY_HEADS", "auto"), "auto")


class Qwen3Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads} KV heads")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        # head_dim is a free parameter (128 in Qwen3-TTS even at hidden 1024), so q/o are not square.
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        # The fused q|k|v weight (the GPU path's one GEMM), made here so that the loaded weights are written into it
        # (load_into copies in place): fused on first use, the three copies it replaced stayed reserved as holes in
        # the allocator's cache (~660 MiB with gate|up for the 0.6B talker, session 21 call 3's snapshot).
        self._qkv = fuse_weights([self.q_proj, self.k_proj, self.v_proj])

    def fused_groups(self) -> dict[str, list[nn.Linear]]:
        """Fused weight attribute -> the Linears whose weights are views of it (fused_linear.cast_fused_groups)."""
        return {"_qkv": [self.q_proj, self.k_proj, self.v_proj]}

    def fused_qkv(self) -> torch.Tensor | None:
        """The fused q|k|v weight (fused again if a weight was replaced since, e.g. by a cast; None while a CUDA graph
        is being captured then)."""
        self._qkv = kept_fused(self._qkv, [self.q_proj, self.k_proj, self.v_proj])
        return self._qkv

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        nq, nk = self.q_proj.out_features, self.k_proj.out_features
        return qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v projections; on the GPU path one GEMM over the fused q|k|v weight, sliced (views)."""
        if use_kernels(x):
            fused = self.fused_qkv()
            if fused is not None:
                return self.split_qkv(F.linear(x, fused))
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def _norm_rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, S, Hq, D], k [B, S, Hkv, D] (projections viewed per head) -> per-head-normed, rotated
        q [B, Hq, S, D], k [B, Hkv, S, D] (transposed views)."""
        if use_kernels(q):
            # q_norm, k_norm and RoPE in one launch (three with the per-op kernels), same numerics.
            from voxflow.kernels import qk_norm_rope as fused   # imported lazily: CPU runs never load Triton
            qw, kw = self.q_norm.weight, self.k_norm.weight
            if fused.supported(q, k, qw, kw, cos, sin):
                q, k = fused.qk_norm_rope(q, k, qw, kw, cos, sin, self.q_norm.eps, self.k_norm.eps)
                return q.transpose(1, 2), k.transpose(1, 2)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(k).transpose(1, 2)
        return apply_rotary(q, k, cos, sin)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKVCache | None,
                bias: torch.Tensor | None) -> torch.Tensor:
        return self.o_proj(self.attend(*self._project(x), cos, sin, cache, bias))

    def attend_folded(self, qkv: torch.Tensor, rows: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                      cache) -> torch.Tensor:
        """The attention of rows from a q|k|v projection [B, S, width] through the input-norm-folded weight
        (voxflow/layers/folded_norms.py) of the layer input rows [B * S, H] -> [B, S, Hq * D]: the row factor
        applied by the attention core of a cache that attends from raw projections (the code predictor's; S new
        tokens a row attend causally), else by qk_norm_rope (q, k and v) before the cache's own `attend` (the
        talker's paged view, S = 1 only: S > 1 without a raw-attending cache raises); where neither kernel takes the
        shapes, by `folded_norms.scale_rows` before the usual path (with a causal mask over the static cache for
        S > 1)."""
        from voxflow.kernels import qk_norm_rope as fused
        from voxflow.layers import folded_norms as fn
        b, s = qkv.shape[:2]
        q, k, v = self.split_qkv(qkv)
        per_head = (b, s, -1, self.head_dim)
        attend_raw = getattr(cache, "attend_raw", None)
        if attend_raw is not None:
            out = attend_raw(q.view(per_head), k.view(per_head), v.view(per_head), self.q_norm, self.k_norm, cos,
                             sin, self.scale, folded_norm=(rows, eps))
            if out is not None:
                return out.reshape(b, s, -1)
        elif s == 1:
            qh, kh, vh = q.view(per_head), k.view(per_head), v.view(per_head)
            qw, kw = self.q_norm.weight, self.k_norm.weight
            if fused.supported(qh, kh, qw, kw, cos, sin) and fused.supported_folded(rows, qh, kh, vh):
                qn, kn, vn = fused.qk_norm_rope(qh, kh, qw, kw, cos, sin, self.q_norm.eps, self.k_norm.eps,
                                                folded=(rows, eps, vh))
                out = cache.attend(qn.transpose(1, 2), kn.transpose(1, 2), vn.transpose(1, 2), None, self.scale)
                return out.reshape(b, 1, -1)
        if s > 1 and attend_raw is None:
            # (the causal mask below knows a static cache's length only, not a paged view's ragged rows)
            raise ValueError(f"{s} new tokens a row through the folded layers need a cache that attends raw "
                             "projections (the code predictor's static cache)")
        bias = (None if s == 1 else
                attention_bias(s, cache.seq_len + s, None, batch=b, dtype=qkv.dtype, device=qkv.device))
        scaled = fn.scale_rows(qkv.reshape(b * s, -1), rows, eps).view(b, s, -1)
        return self.attend(*self.split_qkv(scaled), cos, sin, cache, bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: LayerKVCache | None, bias: torch.Tensor | None) -> torch.Tensor:
        """Projections q [B, S, Hq * D], k / v [B, S, Hkv * D] -> attention output [B, S, Hq * D] (before o_proj):
        per-head norms, RoPE, the cache, attention."""
        b, s, _ = q.shape
        per_head = (b, s, -1, self.head_dim)
        attend_raw = getattr(cache, "attend_raw", None)
        if attend_raw is not None and s == 1 and bias is None and use_kernels(q):
            # A cache that takes the raw projections (the code predictor's static cache): norms, RoPE, the append
            # and attention in one kernel.
            out = attend_raw(q.view(per_head), k.view(per_head), v.view(per_head), self.q_norm, self.k_norm, cos,
                             sin, self.scale)
            if out is not None:
                return out.reshape(b, s, -1)
        q, k = self._norm_rope(q.view(per_head), k.view(per_head), cos, sin)
        v = v.view(per_head).transpose(1, 2)
        attend = getattr(cache, "attend", None)
        if attend is not None:
            # A cache that attends itself (the paged view: it may run a fused kernel straight from its pages).
            out = attend(q, k, v, bias, self.scale)
        else:
            if cache is not None:
                k, v = cache.append(k, v)
            out = None
            if bias is None and use_kernels(q):
                # One query over a small contiguous cache (the code predictor's steps): one fused kernel.
                from voxflow.kernels import dense_decode_attention as dense
                if dense.supported(q, k):
                    out = dense.dense_decode_attention(q, k, v, self.scale)
            if out is None:
                out = eager_attention(q, k, v, bias, self.scale)
        return out.reshape(b, s, -1)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float):
        super().__init__()
        self.self_attn = Qwen3Attention(hidden_size, num_heads, num_kv_heads, head_dim, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self._derived = None                  # folded_norms.folded_weights' copies (GPU path), made on first use

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKVCache | None,
                bias: torch.Tensor | None) -> torch.Tensor:
        x, pending = self.forward_deferred(x, None, cos, sin, cache, bias)
        return x if pending is None else x + pending

    def forward_deferred(self, x: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                         cache: LayerKVCache | None, bias: torch.Tensor | None, x_owned: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on the input x + pending (pending: the previous layer's MLP output, not yet added) -> its
        output as (x, pending) with the same meaning. On the kernel path above the skinny sizes the final residual
        add is left pending, so that the next layer's input norm (or the stack's final norm) takes it in one
        fused add + norm launch instead of an add and a norm; the sum is rounded where `x + mlp` would round it,
        so the residual stream carries the same bits. Elsewhere pending comes back None, and so from the folded
        path (FOLDED_NORMS), whose down_proj GEMM adds the residual itself.
        x_owned: x is the caller's own scratch (an earlier layer's output, or a stack input its caller handed over
        with Qwen3DecoderStack.forward's x_owned), which the folded path may add into in place (saves a copy a
        residual add); otherwise x is never overwritten."""
        kernels = use_kernels(x)
        if kernels and x.shape[0] * x.shape[1] <= SKINNY_MAX_ROWS:
            if pending is not None:     # (a stack's layers all take one branch: only a mixed caller gets here)
                x, pending = x + pending, None
            out = self._forward_skinny(x, cos, sin, cache, bias)
            if out is not None:
                return out, None
        if kernels and pending is None and x.shape[1] == 1 and bias is None and _folds(cache):
            out = self._forward_folded(x, cos, sin, cache, x_owned)
            if out is not None:
                return out, None
        if kernels:
            norm = self.input_layernorm
            if pending is None:
                normed = norm(x)
            else:
                normed, x = add_rms_norm(x, pending, norm.weight, norm.eps)
            h = self.self_attn(normed, cos, sin, cache, bias)
            # The attention's residual add fused into the post-attention norm the same way.
            norm = self.post_attention_layernorm
            normed, x = add_rms_norm(x, h, norm.weight, norm.eps)
            return x, self.mlp(normed)
        if pending is not None:
            x = x + pending
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, bias)
        return x + self.mlp(self.post_attention_layernorm(x)), None

    def _forward_skinny(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKVCache | None,
                        bias: torch.Tensor | None) -> torch.Tensor | None:
        """The layer for a few rows (decode steps), with the skinny decode GEMM (voxflow/kernels/skinny_linear.py)
        where it beats cuBLAS plus the separate element-wise launch (measured on an H200, bf16: see
        benchmarks/results/h200/2026-12-01-fused-decode/tune_skinny_linear.txt): o_proj with the residual add in
        its epilogue (cuBLAS picks a split-K kernel + reduce there), and at one row down_proj with silu * up in its
        prologue and the residual add in its epilogue. q|k|v and gate|up stay on cuBLAS after the norm kernel: at
        these widths cuBLAS streamed W faster than skinny_linear's fused norm prologue; at one row norm_linear.py's
        one-pass norm beats both (ONE_ROW_NORM_LINEAR, on by default: `_forward_one_row`). Same rounding points
        as the unfused path. None: not applicable here."""
        from voxflow.kernels import skinny_linear as sk
        attn, mlp = self.self_attn, self.mlp
        qkv_w, gate_up_w = attn.fused_qkv(), mlp.fused_gate_up()
        if qkv_w is None or gate_up_w is None:
            return None
        b, s, hidden = x.shape
        rows = x.reshape(b * s, hidden)
        if b * s <= SKINNY_PROLOGUE_MAX_ROWS and ONE_ROW_NORM_LINEAR:
            out = self._forward_one_row(rows, qkv_w, gate_up_w, cos, sin, cache, bias)
            if out is not None:
                return out.view(b, s, hidden)
        qkv = F.linear(self.input_layernorm(x), qkv_w)
        # (the attention output is Hq * head_dim wide, which need not be the hidden size: 2048 vs 1024 in the
        # 1.7B code predictor)
        out = attn.attend(*attn.split_qkv(qkv), cos, sin, cache, bias).reshape(b * s, -1)
        o_w, down_w = attn.o_proj.weight, mlp.down_proj.weight
        rows = _linear_plus(out, o_w, rows)
        gate_up = F.linear(self.post_attention_layernorm(rows), gate_up_w)
        if b * s <= SKINNY_PROLOGUE_MAX_ROWS and sk.supported(gate_up, down_w, gated=True):
            rows = sk.skinny_linear(gate_up, down_w, gated=True, residual=rows)
        else:
            i = mlp.gate_proj.out_features
            rows = rows + mlp.down(gate_up[..., :i], gate_up[..., i:])
        return rows.view(b, s, hidden)

    def _forward_one_row(self, rows: torch.Tensor, qkv_w: torch.Tensor, gate_up_w: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, cache: LayerKVCache | None, bias: torch.Tensor | None
                         ) -> torch.Tensor | None:
        """ONE_ROW_NORM_LINEAR's layer on rows [1, H]: norm_linear(q|k|v), attention, skinny o_proj + residual,
        norm_linear(gate|up) with silu * up, skinny down_proj + residual. The folded norms round as norm_linear.py
        states (within one 16-bit rounding of the reference; fp32: summation order). None (nothing run): the norm
        GEMMs do not take these shapes."""
        from voxflow.kernels import norm_linear as nl
        attn, mlp = self.self_attn, self.mlp
        ln, post = self.input_layernorm, self.post_attention_layernorm
        o_w, down_w = attn.o_proj.weight, mlp.down_proj.weight
        if not (nl.supported(rows, qkv_w, ln.weight) and nl.supported(rows, gate_up_w, post.weight, swiglu=True)):
            return None
        qkv = nl.norm_linear(rows, qkv_w, ln.weight, ln.eps)[:, None]
        out = attn.attend(*attn.split_qkv(qkv), cos, sin, cache, bias).reshape(1, -1)
        rows = _linear_plus(out, o_w, rows)
        act = nl.norm_linear(rows, gate_up_w, post.weight, post.eps, swiglu=True)
        return _linear_plus(act, down_w, rows)

    def _forward_folded(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, x_owned: bool
                        ) -> torch.Tensor | None:
        """FOLDED_NORMS' layer step on x [B, S, H] (voxflow/layers/folded_norms.py): q|k|v and gate|up through the
        norm-folded weights, the row factors applied by the attention core and silu * up kernels (their torch forms
        where those do not take the shapes), the residual adds inside o_proj's and down_proj's GEMMs. S = 1 a
        decode step; S > 1 only through a cache that attends raw projections causally (`attend_folded`: the code
        predictor's static cache, whose 2-token first step runs so as one pass of B * S rows). None (nothing
        run): the folded weights do not exist yet (first use inside a graph capture)."""
        from voxflow.kernels import silu_mul as sm
        from voxflow.layers import folded_norms as fn
        weights = fn.folded_weights(self)
        if weights is None:
            return None
        qkv_w, gate_up_w = weights
        attn, mlp = self.self_attn, self.mlp
        inter = mlp.gate_proj.out_features
        b, s, hidden = x.shape
        rows = x.reshape(b * s, hidden)
        skinny = _folded_skinny(cache, rows)
        qkv = linear_rows(skinny, rows, qkv_w).view(b, s, -1)  # [B, S, width], not normed yet
        out = attn.attend_folded(qkv, rows, self.input_layernorm.eps, cos, sin, cache)
        # x + o_proj(attention), the add in the GEMM: in place when x is ours to overwrite (an out-of-place addmm
        # first copies x into its output, a launch of its own: 1.1 us a layer step on the H200 at 64 rows)
        h = linear_rows(skinny, out.reshape(b * s, -1), attn.o_proj.weight, residual=rows, in_place=x_owned)
        gate_up = linear_rows(skinny, h, gate_up_w)
        gate, up, post_eps = gate_up[:, :inter], gate_up[:, inter:], self.post_attention_layernorm.eps
        act = (sm.silu_mul_folded(gate, up, h, post_eps) if sm.supported_folded(gate, up, h)
               else fn.silu_mul_folded_reference(gate, up, h, post_eps))
        return linear_rows(skinny, act, mlp.down_proj.weight, residual=h, in_place=True).view(b, s, hidden)  # (ours)


def _folds(cache) -> bool:
    """Whether a single-token layer step through this cache takes the folded-norm path (FOLDED_NORMS*)."""
    if getattr(cache, "attend_raw", None) is not None:
        return FOLDED_NORMS
    return FOLDED_NORMS and FOLDED_NORMS_PAGED and getattr(cache, "attend", None) is not None


def _folded_skinny(cache, rows: torch.Tensor) -> bool:
    """Whether this folded layer step runs its GEMMs on skinny_linear: with rows the kernel takes (each GEMM still
    checks its operands), through the code predictor's cache (it attends raw projections) under CP_SKINNY_GEMMS or
    through the talker's paged view under TALKER_SKINNY_GEMMS."""
    return skinny_gemm_wanted(CP_SKINNY_GEMMS if getattr(cache, "attend_raw", None) is not None
                              else TALKER_SKINNY_GEMMS, rows)


def skinny_gemm_wanted(switch, rows: torch.Tensor) -> bool:
    """Whether a GEMM on `rows` goes to skinny_linear under one of the switches above (True, False or "auto"):
    1..MAX_SKINNY_GEMM_ROWS rows, and the switch True, or "auto" where the kernels launch with PDL."""
    if not 1 <= rows.shape[0] <= MAX_SKINNY_GEMM_ROWS:
        return False
    return switch is True or (switch == "auto" and use_pdl(rows))


def linear_rows(skinny: bool, a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                in_place: bool = False) -> torch.Tensor:
    """[residual +] a @ w^T for a folded layer step or a head: on skinny_linear (the add in its epilogue) when
    `skinny` and it takes the operands, else cuBLAS (F.linear, or addmm with the add in the GEMM). in_place: the sum
    is written into residual."""
    if skinny:
        from voxflow.kernels import skinny_linear as sk
        if sk.supported(a, w):
            return sk.skinny_linear(a, w, residual=residual, out=residual if in_place else None)
    if residual is None:
        return F.linear(a, w)
    return residual.addmm_(a, w.t()) if in_place else torch.addmm(residual, a, w.t())


def _linear_plus(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ w^T for a few rows: the skinny GEMM with the add in its epilogue where it applies."""
    from voxflow.kernels import skinny_linear as sk
    return sk.skinny_linear(x, w, residual=residual) if sk.supported(x, w) else residual + F.linear(x, w)


class Qwen3DecoderStack(nn.Module):
    """`layers` + final `norm` (+ RoPE tables, not in the state dict). Built from a DecoderStackConfig.

    Subclasses add their embedding tables as attributes so the state-dict keys match the checkpoint.
    """

    def __init__(self, cfg) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                              cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, getattr(cfg, "max_position_embeddings", None))

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None, final_norm: bool = True,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, x_owned: bool = False) -> torch.Tensor:
        """x [B, S, H], positions [B, S] (RoPE positions of the new tokens) -> normed hidden [B, S, H]
        (un-normed with final_norm=False: for a caller that fuses the norm into its next GEMM).
        rope: the positions' cos / sin [1 or B, S, D] when the caller has them already (positions then unused).

        cache: appended to in place (None: no cache, the S tokens attend only among themselves).
        attention_mask: [B, T] (1/True = real token) over *all* T = cached + S key slots; None = no padding.
        x_owned: x is the caller's scratch, which the first layer may overwrite too (else only later layers add
        into their input in place).
        """
        b, s, _ = x.shape
        past = cache.seq_len if cache is not None else 0
        if rope is not None:
            cos, sin = rope
        elif positions.shape != (b, s):
            raise ValueError(f"positions has shape {tuple(positions.shape)}, expected {(b, s)}")
        else:
            cos, sin = self.rotary(positions, x.dtype)
        bias = attention_bias(s, past + s, attention_mask, batch=b, dtype=x.dtype, device=x.device)
        pending = None          # the last MLP output not yet added to x (forward_deferred)
        for i, layer in enumerate(self.layers):
            x, pending = layer.forward_deferred(x, pending, cos, sin, cache[i] if cache is not None else None, bias,
                                                x_owned=x_owned or i > 0)
        if pending is None:
            return self.norm(x) if final_norm else x
        if final_norm:
            return add_rms_norm(x, pending, self.norm.weight, self.norm.eps)[0]
        return x + pending


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions for a left-padded batch: cumsum(mask) - 1, so each row's first real token is at 0
    whatever its padding. Padding slots get 0 (their outputs are never read)."""
    mask = attention_mask.to(torch.long)
    return (mask.cumsum(-1) - 1).clamp_min(0) * mask
