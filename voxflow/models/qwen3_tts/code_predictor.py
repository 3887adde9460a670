"""The code predictor ("MTP"): fills in codebooks 1..15 of a frame from the talker's state and code 0.

Per frame it runs a tiny autoregressive pass that always starts from an empty KV cache:
    position 0: the talker's last hidden state h (post final norm)
    position 1: the talker's codec embedding of c0            -> lm_head[0]  -> c1
    position j+1 (j = 1..14): codec_embedding[j-1](c_j)       -> lm_head[j]  -> c_{j+1}
i.e. one 2-token prefill and 14 single-token steps, positions 0..15; c15 is never fed back.
All inputs live at the talker's width H and go through `small_to_mtp_projection` (a Linear with bias when
H differs from the predictor's width, as in the 1.7B model; Identity with no weights otherwise, as in 0.6B).

State-dict keys (checkpoint prefix `talker.code_predictor.` removed): `model.layers.*`, `model.norm`,
`model.codec_embedding.{0..14}`, `lm_head.{0..14}`, and `small_to_mtp_projection.{weight,bias}` if present.
"""
from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.attention import KVCache
from voxflow.layers.derived_weights import per_weight_version
from voxflow.layers import qwen3_layer
from voxflow.layers.qwen3_layer import SKINNY_MAX_ROWS, SKINNY_PROLOGUE_MAX_ROWS, Qwen3DecoderStack
from voxflow.layers.static_kv_cache import StaticKVCache
from voxflow.models.qwen3_tts.config import CodePredictorConfig

SKINNY_BIAS_MAX_ROWS = 4     # H200: the skinny GEMM beats cuBLAS's bias GEMM up to 4 rows (5.9 vs 8.7 us at 4)
# The kernel path's single-token steps run each decoder layer as four fused kernels (voxflow/kernels/cp_layer.py:
# norm folded into q|k|v, attention + o_proj + residual, norm folded into gate|up with silu * up, down + residual)
# for up to CP_FUSED_MAX_ROWS rows. Off: the per-layer path of Qwen3DecoderLayer (seven launches a layer).
# ON by default: with attention_o_proj.py splitting the heads over the programs (a first version that redid the
# whole attention in every program was slower), H200, bf16, 1.7B, one row: 22.25 vs 28.42 us a layer step, 2.21 vs
# 2.47 ms a frame's predict, greedy codes equal (benchmarks/results/h200/2026-12-01-session5/tune_cp_rows1.txt).
# VOXFLOW_CP_FUSED_LAYER=0 turns it off.
CP_FUSED_LAYER = os.environ.get("VOXFLOW_CP_FUSED_LAYER", "1") == "1"
CP_FUSED_MAX_ROWS = 1
# The frame's 2-token first step (positions 0 and 1) through the same four-kernel layers, one position after the
# other (the cache makes that the causal 2-token prefill), instead of the per-layer path (rms_norm, cuBLAS, eager
# attention over the 2 positions, ~22 launches a layer outside the PDL chain). H200, 1.7B c=1
# (benchmarks/results/h200/2026-12-04-session29, call 1's timeline): that first step took 338 us of the 3.39 ms
# step against ~117 us for each single-token step. VOXFLOW_CP_FUSED_PREFILL=0 turns it off.
CP_FUSED_PREFILL = os.environ.get("VOXFLOW_CP_FUSED_PREFILL", "1") == "1"
# Above CP_FUSED_MAX_ROWS the same idea through the stack's single-token path (above 8 rows the folded-norm layers
# with q/k norms, RoPE, append and attention in one kernel, ~7 launches a layer; 2-8 rows the skinny layers with
# the dense decode attention): the first step's positions one after the other instead of the per-layer path's ~22
# launches a layer (eager attention over 2 positions, its masks, softmax and copies). Why: H200 session 35's 0.6B
# c=64 timeline, that first step ~0.6 ms of a 6.25 ms step against ~0.27 for each single-token step, and beside
# the codec every launch costs ~1.9 us more (position 0's last layer runs its MLP for nothing, ~4 launches). ON:
# H200 0.6B c=64 timeline 966 -> 924 kernels a step, timed step 6.25 -> 6.16 ms; offline 0.6B c=64 689.3 against
# 696.7 / 684.7 off, 1.7B c=64 630.7 -> 642.4 audio-s/s (benchmarks/results/h200/2026-12-05-session36, call 1).
# VOXFLOW_CP_SPLIT_PREFILL=0 turns it off.
CP_SPLIT_PREFILL = os.environ.get("VOXFLOW_CP_SPLIT_PREFILL", "1") == "1"
# Above the skinny sizes with the folded-norm layers, that first step as ONE pass of 2B rows instead (`_joint_layers`:
# the GEMMs on both positions' rows at once; the attention core appends both positions' keys / values and attends
# causally, dense_decode_norm_rope.py's S-token form). Why: split, the frame makes 16 passes of the 5 layers at B
# rows where 15 are needed, and at 64 rows a layer pass is ~57 us of mostly weight-streaming GEMMs (0.6B c=64,
# H100 session 40's timeline) that take 2B rows for about the price of B. Positions 0 and 1 then round through
# GEMMs of another row count (cuBLAS may pick other kernels): within the bf16 tolerance of the split path, not its
# bits. At one row (CP_FUSED_LAYER's four-kernel layers) the same switch runs the step's two positions as the two
# rows of one pass of those kernels (`_fused_layers`: attention_o_proj's joint form, the second row attending to the
# first): 4 + 5 layer steps a frame -> 5, each weight streamed once. Between 2 and SKINNY_MAX_ROWS rows the step
# goes position by position. The default since session 44 (H100): 0.6B c=64 offline 747.3 / 747.3 audio-s/s against
# 731.2 / 732.0 split, full steps 5.56-5.59 against 5.70 ms; 1.7B c=64 667.0 against 654.6; 0.6B c=64 over HTTP
# 741.1 against 710.9 / 711.3 (session 43); 1.7B c=1 RTF mean 0.04467 / 0.04467 against 0.04476 / 0.04475 (0.2%,
# steady). VOXFLOW_CP_JOINT_PREFILL=0 turns it off (an A/B).
CP_JOINT_PREFILL = os.environ.get("VOXFLOW_CP_JOINT_PREFILL", "1") == "1"
# After fused layers, the final norm + lm_head through norm_linear.py (norm folded into the GEMM) instead of
# skinny_linear's norm prologue: off, the prologue measured faster there (H200, M = 1: 4.26 vs 4.92 us).
CP_NORM_LINEAR_LM_HEAD = False
# The draws copy the drawn code's embedding row (batch_sampling's draw_and_embed): no lookup launch a step (15 a
# frame, each outside the PDL chain). H200 c=1 step 3.55 -> 3.51 ms (benchmarks/results/h200/2026-12-02-session12,
# call 5). VOXFLOW_DRAW_AND_EMBED=0 turns it off (the lookups run as before; same bits).
DRAW_AND_EMBED = os.environ.get("VOXFLOW_DRAW_AND_EMBED", "1") == "1"
# With a projection (the 1.7B model: talker width 2048 -> 1024), the single-token steps' inputs come projected from
# precomputed tables (small_to_mtp_projection of every row of codec_embedding[0..13], 59 MB at the 1.7B shapes,
# made once per weight version: `projected_tables`), copied by the draw beside the raw row (select_tokens' embed2):
# no projection GEMM a step (14 a frame; ~3.3 us each on the c=1 step's critical path, H200 session 29 call 2's
# timeline). The rows are the projection's up to its summation order. H200 session 30 call 4: 1.7B c=1 step 3.242 ->
# 3.205 ms (session 29's 117 -> 137 us a step with them was pdl.py's placement effect, gone with attention_o_proj
# on the exit trigger). VOXFLOW_PROJECTED_TABLES=0 turns it off.
PROJECTED_TABLES = os.environ.get("VOXFLOW_PROJECTED_TABLES", "1") == "1"
# Above the skinny sizes the folded layers add o_proj's output into their input rows; into a stack's input only
# when it is the stack's own (OWNED_INPUT), else torch.addmm first copies the rows (a launch: 16 a 0.6B c=64 step,
# 1.6 us each alone on the H200, session 36's timeline). A single-token step's input is the stack's own when the
# draw wrote it for nothing else: the projected table row (the 1.7B), or without a projection (the 0.6B) a second
# copy of the drawn row made by the draw itself (select_tokens' embed2; the first copy is kept for the frame's
# embedding sum); the split first step's pieces are when they are copies of its input rows (more than one row).
# The same bits (addmm_ into the rows is the GEMM torch.addmm runs after its copy; its GPU test passed in session
# 41). VOXFLOW_CP_OWNED_INPUT=0 turns it off.
OWNED_INPUT = os.environ.get("VOXFLOW_CP_OWNED_INPUT", "1") == "1"
# The final RMSNorm folded into the 15 lm_heads (folded_norms.fold_final_norm_in_place, done by the engine's loader
# with this on): above the skinny sizes a step's head reads the stack's un-normed rows and the draw scales each
# logits row by the row's factor (select_tokens' row_scale, rounded to the logits' dtype as the head's output
# would be) -- no norm launch a draw (15 a 0.6B c=64 step, ~2 us each alone on the H200, session 36's timeline;
# the split first step's position 0 has none already).
# Session 41 (H100, benchmarks/results/h100/2026-12-05-session41/call1): 0.6B c=64 full-step medians 5.75 / 5.74 ms
# against 5.79 / 5.75 without it, 719.6 / 725.0 audio-s/s against 716.8 / 716.2. VOXFLOW_CP_FOLDED_HEAD=0 turns it off.
CP_FOLDED_HEAD = os.environ.get("VOXFLOW_CP_FOLDED_HEAD", "1") == "1"

# sample_fn(logits [B, vocab], j) -> codes [B] (long), where j = 0..14 is the lm_head index / codebook j+1.
SampleFn = Callable[[torch.Tensor, int], torch.Tensor]


class CodePredictorBackbone(Qwen3DecoderStack):
    """Decoder stack plus the 15 input tables (codebooks 1..15, embedded at the talker's width)."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden_size: int):
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden_size) for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden_size: int):
        super().__init__()
        self.cfg = cfg
        self.num_residual = cfg.num_code_groups - 1
        self.model = CodePredictorBackbone(cfg, talker_hidden_size)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(self.num_residual))
        if talker_hidden_size != cfg.hidden_size:
            self.small_to_mtp_projection = nn.Linear(talker_hidden_size, cfg.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        self._derived = None                    # projected_tables' stack, made on first use (derived_weights.py)

    def new_cache(self, like: torch.Tensor | None = None) -> KVCache | StaticKVCache:
        """The KV cache of one frame's pass. On the kernel path (`like` on a GPU) a preallocated one that the
        fused attention kernel appends to; elsewhere the growing reference cache."""
        if like is not None and use_kernels(like):
            cfg = self.cfg
            return StaticKVCache(cfg.num_hidden_layers, like.shape[0], cfg.num_key_value_heads, cfg.num_code_groups,
                                 cfg.head_dim, like.dtype, like.device)
        return self.model.new_cache()

    def embed_residual(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [..., 15] (codebooks 1..15) -> their input embeddings [..., 15, H_talker]."""
        return torch.stack([self.model.codec_embedding[g](codes[..., g]) for g in range(self.num_residual)],
                           dim=-2)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor | None, cache: KVCache | None = None,
                final_norm: bool = True, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """inputs_embeds [B, S, H_talker] -> normed hidden [B, S, H_cp]. No padding: every row of a
        code-predictor batch is at the same step."""
        return self.model(self._project(inputs_embeds), positions, cache, final_norm=final_norm, rope=rope)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """small_to_mtp_projection; on the kernel path for a few rows the skinny GEMM (H200, bf16, 2048 -> 1024 with
        bias: 4.1 us instead of cuBLAS's 13 us at one row; same rounding: the bias added before the one rounding)."""
        proj = self.small_to_mtp_projection
        b, s, _ = x.shape
        if isinstance(proj, nn.Linear) and b * s <= SKINNY_BIAS_MAX_ROWS and use_kernels(x):
            from voxflow.kernels import skinny_linear as sk
            rows = x.reshape(b * s, -1)
            if sk.supported(rows, proj.weight) and proj.bias is not None:
                return sk.skinny_linear(rows, proj.weight, bias=proj.bias).view(b, s, -1)
        return proj(x)

    def projected_tables(self) -> torch.Tensor | None:
        """[num_residual - 1, vocab, H_cp]: small_to_mtp_projection of every row of codec_embedding[0..13] (the
        inputs of steps 1..14), made once per weight version (derived_weights.py); None without a projection (0.6B)
        or when it would first be made inside a CUDA-graph capture (its memory would be the graph's, remade on
        every replay)."""
        proj = self.small_to_mtp_projection
        if not isinstance(proj, nn.Linear):
            return None
        tables = [t.weight for t in self.model.codec_embedding[:self.num_residual - 1]]
        params = (proj.weight,) + ((proj.bias,) if proj.bias is not None else ()) + tuple(tables)
        return per_weight_version(self, params, lambda: torch.stack([proj(t) for t in tables]), none_in_capture=True)

    def _kernel_step_logits(self, x: torch.Tensor, start: int, cache, rope, j: int,
                            projected: torch.Tensor | None = None, owned: bool = False, unnormed: bool = False
                            ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The kernel path of one step: RoPE rows sliced from the precomputed positions 0..15 (no kernels), the
        single-token steps (and with CP_FUSED_PREFILL the 2-token first step: at one row as one pass of both
        positions with CP_JOINT_PREFILL, else position by position) through the fused layer kernels
        (`_fused_layers`, when on and applicable; else above the skinny sizes with CP_JOINT_PREFILL, the default,
        that first step as one pass of both positions' rows, `_joint_layers`; else, with CP_SPLIT_PREFILL,
        position by position through the stack's single-token path), and the final norm: for one row inside
        lm_head[j]'s GEMM, last position only (one launch: skinny_linear.py's norm prologue, or norm_linear.py's
        one-pass norm with CP_NORM_LINEAR_LM_HEAD); for more, the stack's (fused
        with its last residual add above the skinny sizes), then lm_head[j]. `projected`: x already projected (the
        rows of `projected_tables`, or x's rows themselves without a projection); owned: rows no one else reads,
        which the stack may overwrite (OWNED_INPUT). unnormed (CP_FOLDED_HEAD, above the skinny sizes, with the
        final norm folded into the heads): the head on the stack's un-normed last rows -> (those logits, the rows),
        for the draw to scale by the rows' factor (on skinny_linear under qwen3_layer.SKINNY_HEADS)."""
        b, s, _ = x.shape
        cos, sin = rope[0][:, start:start + s], rope[1][:, start:start + s]
        h = projected if projected is not None else self._project(x)
        last = None
        fused = CP_FUSED_LAYER and (s == 1 or CP_FUSED_PREFILL) and b <= CP_FUSED_MAX_ROWS
        if fused:
            last = self._fused_layers(h, cos, sin, cache)
        elif s > 1 and CP_JOINT_PREFILL and b > SKINNY_MAX_ROWS:
            # positions 0 .. s-1 in one pass; a projection's output (not x itself, whose last row is the frame's
            # c0 row) is the pass's own to add into
            last = self._joint_layers(h, cos, sin, cache, owned=OWNED_INPUT and h is not x)
        if last is None:
            owned = owned and s == 1
            if s > 1 and CP_SPLIT_PREFILL:
                # (the cache's append order makes this the causal s-token prefill; only the last position's
                # output is read). A piece that `contiguous` copied is the stack's own (OWNED_INPUT); a view
                # (one row) is not: x's last row is the frame's c0 row.
                for p in range(s - 1):
                    piece = h[:, p:p + 1].contiguous()
                    self.model(piece, None, cache, final_norm=False, rope=(cos[:, p:p + 1], sin[:, p:p + 1]),
                               x_owned=OWNED_INPUT and piece._base is None)
                h, cos, sin = h[:, s - 1:].contiguous(), cos[:, s - 1:], sin[:, s - 1:]
                owned = OWNED_INPUT and h._base is None
            if b > SKINNY_PROLOGUE_MAX_ROWS and not unnormed:
                # normed by the stack: its last residual add and the final norm are one fused launch
                return self.lm_head[j](self.model(h, None, cache, rope=(cos, sin), x_owned=owned)[:, -1])
            last = self.model(h, None, cache, final_norm=False, rope=(cos, sin), x_owned=owned)[:, -1]
        if unnormed:                 # (the stack's or the fused layers' last rows, un-normed)
            skinny = qwen3_layer.skinny_gemm_wanted(qwen3_layer.SKINNY_HEADS, last)
            return qwen3_layer.linear_rows(skinny, last, self.lm_head[j].weight), last
        head, norm = self.lm_head[j].weight, self.model.norm
        if fused and CP_NORM_LINEAR_LM_HEAD:
            from voxflow.kernels import cp_layer, norm_linear as nl
            if nl.supported(last, head, norm.weight):
                return nl.norm_linear(last, head, norm.weight, norm.eps, config=cp_layer.CONFIGS["lm_head"])
        if last.shape[0] <= SKINNY_PROLOGUE_MAX_ROWS:    # one row: the fused norm prologue beats norm + cuBLAS
            from voxflow.kernels import skinny_linear as sk
            if sk.supported(last, head):
                return sk.skinny_linear(last, head, norm_weight=norm.weight, eps=norm.eps)
        return self.lm_head[j](norm(last))      # rows the fused layers made (CP_FUSED_MAX_ROWS > 1), or no skinny

    def _fused_layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache) -> torch.Tensor | None:
        """The decoder layers on S new tokens per row (h [B, S, H], projected; cos / sin [1, S, D]) through
        voxflow/kernels/cp_layer.py's four kernels a layer, one position after the other (each appends its keys /
        values before the next attends to them: the causal S-token step) -> the last position's un-normed hidden
        [B, H]. The last layer of every position but the last only appends its keys / values (its output is never
        read). None (nothing run, the cache untouched) when they do not apply: no static cache, weights not fused
        yet (first use inside a graph capture), sizes."""
        from voxflow.kernels import cp_layer
        if not isinstance(cache, StaticKVCache):
            return None
        b, s = h.shape[:2]
        weights = [_layer_weights(layer) for layer in self.model.layers]
        if any(w is None for w in weights) or not all(
                cp_layer.supported(h[:, 0], w, cos[:, :1], sin[:, :1], c.k, c.v) and c.length + s <= c.k.shape[2]
                for w, c in zip(weights, cache.layers)):
            return None
        if (CP_JOINT_PREFILL and b == 1 and s == 2
                and all(cp_layer.supported(h[0], w, cos[0], sin[0], c.k, c.v, joint=True)
                        for w, c in zip(weights, cache.layers))):
            # both positions as the two rows of one pass (each weight streamed once): the second attends to the
            # first (attention_o_proj's joint form); the last layer runs both rows too
            rows = h[0]
            for w, c in zip(weights, cache.layers):
                rows = cp_layer.layer_step(rows, w, cos[0], sin[0], c.k, c.v, c.claim(2), joint=True)
            return rows[1:]
        for p in range(s):
            rows, cos_p, sin_p = h[:, p].contiguous(), cos[:, p:p + 1], sin[:, p:p + 1]
            for i, (w, c) in enumerate(zip(weights, cache.layers)):
                if p < s - 1 and i == len(weights) - 1:
                    cp_layer.layer_append(rows, w, cos_p, sin_p, c.k, c.v, c.claim())
                else:
                    rows = cp_layer.layer_step(rows, w, cos_p, sin_p, c.k, c.v, c.claim())
        return rows

    def _joint_layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, owned: bool = False
                      ) -> torch.Tensor | None:
        """CP_JOINT_PREFILL: the decoder layers on S new tokens a row (h [B, S, H], projected; cos / sin [1, S, D])
        as one pass of B * S rows through the folded-norm layers (Qwen3DecoderLayer._forward_folded), whose
        attention core appends the S positions' keys / values and attends causally -> the last position's
        un-normed hidden [B, H] (a view of the pass's output: rows 2H apart, which lm_head's GEMM and the draw's
        row_scale take as they are). owned: h is the caller's scratch, which the first layer may add into (else
        only later layers add into their input). None (nothing run, the cache untouched) when that path does not
        apply: no static cache, the norms not folded, the folded weights not made yet (first use inside a graph
        capture), no room in the cache."""
        from voxflow.layers import folded_norms as fn
        if not (isinstance(cache, StaticKVCache) and qwen3_layer.FOLDED_NORMS):
            return None
        s = h.shape[1]
        if any(fn.folded_weights(layer) is None for layer in self.model.layers) or any(
                c.length + s > c.k.shape[2] for c in cache.layers):
            return None
        x = h
        for i, (layer, c) in enumerate(zip(self.model.layers, cache.layers)):
            x = layer._forward_folded(x, cos, sin, c, x_owned=owned or i > 0)
        return x[:, -1]

    @torch.no_grad()
    def predict(self, h_last: torch.Tensor, c0_embed: torch.Tensor, sample_fn: SampleFn, frame_embed: bool = False,
                embed_parts: bool = False) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        """One frame's residual codes.

        h_last [B, H]: talker hidden state (after its final norm) at the position that produced c0.
        c0_embed [B, H]: the talker's codec embedding of c0.
        Returns codes [B, 15] (codebooks 1..15) and the raw logits [B, 15, vocab] each was drawn from; with
        frame_embed, the logits are not kept and the second value is instead the sum of the frame's 16 input
        embeddings [B, H] (what Talker.embed_frame computes, from the lookups this pass already made: the same
        rows stacked in the same order and summed, so the same bits). With embed_parts too, where the draws copy
        the rows themselves (the kernel path) and they can write straight into one buffer (a projected next input,
        or one row), the sum is left to the caller's fused kernel: the second value is then (c0_embed, rows
        [B, 16, H] whose [:, 1:] are the 15 drawn codes' rows; [:, 0] unused) -- the same 16 rows.
        """
        b = h_last.shape[0]
        device = h_last.device
        cache = self.new_cache(like=h_last)
        kernels = use_kernels(h_last)
        rope = self.model.rotary.prefix(self.cfg.num_code_groups, device, h_last.dtype) if kernels else None
        x = torch.stack((h_last, c0_embed), dim=1)
        codes, logits, inputs = [], [], []
        tables = self.model.codec_embedding
        # On the kernel path the draw may copy the drawn code's embedding row itself (batch_sampling's
        # draw_and_embed: one launch fewer a step); `row` is then the next step's input, else it is looked up.
        draw_and_embed = getattr(sample_fn, "draw_and_embed", None) if kernels and DRAW_AND_EMBED else None
        # ... and the projected row of a precomputed table beside it (PROJECTED_TABLES): no projection GEMM a step.
        projected = self.projected_tables() if draw_and_embed is not None and PROJECTED_TABLES else None
        # ... or, without a projection, a second copy of the raw row for the folded layers to overwrite (OWNED_INPUT)
        second_copy = (draw_and_embed is not None and OWNED_INPUT and b > SKINNY_MAX_ROWS and qwen3_layer.FOLDED_NORMS
                       and not isinstance(self.small_to_mtp_projection, nn.Linear))
        # ... and, with the final norm folded into the heads, the draws scale the logits themselves (CP_FOLDED_HEAD)
        # (not in fp16: un-normed rows through a head can overflow where the normed ones would not)
        folded_head = (draw_and_embed is not None and frame_embed and CP_FOLDED_HEAD and b > SKINNY_MAX_ROWS
                       and getattr(self.model.norm, "folded_into_heads", False) and h_last.dtype != torch.float16)
        row = row_projected = None
        parts = None
        if frame_embed and embed_parts and draw_and_embed is not None and (projected is not None or b == 1):
            # (each row the next step's input only through its projected table row, or one contiguous row)
            parts = torch.empty(b, self.num_residual + 1, tables[0].weight.shape[1], dtype=tables[0].weight.dtype,
                                device=device)
        for j in range(self.num_residual):
            if j > 0:
                x = (row if row is not None else tables[j - 1](codes[-1]))[:, None]
            start = 0 if j == 0 else j + 1          # position of x's first token (the prefill covers 0 and 1)
            scale = None
            if kernels:
                step_logits = self._kernel_step_logits(
                    x, start, cache, rope, j, None if row_projected is None else row_projected[:, None],
                    owned=OWNED_INPUT and row_projected is not None, unnormed=folded_head)
                if folded_head:
                    step_logits, scale = step_logits[0], (step_logits[1], self.model.norm.eps)
            else:
                positions = torch.arange(start, start + x.shape[1], device=device).expand(b, -1)
                # The head runs on every position of the step (both prefill ones), as the reference does, so its
                # GEMM has the reference's shape.
                step_logits = self.lm_head[j](self(x, positions, cache))[:, -1]
            if not frame_embed:
                logits.append(step_logits)
            if draw_and_embed is not None:       # (plain nn.Embedding tables, __init__: a row copy is the lookup)
                second = None
                if j < self.num_residual - 1:           # (the last code's row is no step's input)
                    second = projected[j] if projected is not None else tables[j].weight if second_copy else None
                code, row, row_projected = draw_and_embed(step_logits, j, tables[j].weight, second,
                                                          out=None if parts is None else parts[:, j + 1],
                                                          row_scale=scale)
                if row is None:
                    parts = None
            else:
                code, row, row_projected = sample_fn(step_logits, j), None, None
            codes.append(code.to(torch.long))
            if frame_embed:
                inputs.append(x[:, -1])
        if parts is not None:
            return torch.stack(codes, dim=1), (c0_embed, parts)
        if frame_embed:
            last = row if row is not None else tables[self.num_residual - 1](codes[-1])     # the last code's row
            inputs.append(last)
            return torch.stack(codes, dim=1), torch.stack(inputs, dim=-2).sum(dim=-2)
        return torch.stack(codes, dim=1), torch.stack(logits, dim=1)


def _layer_weights(layer):
    """A Qwen3DecoderLayer's tensors for voxflow/kernels/cp_layer.py (None while its fused weights do not exist)."""
    from voxflow.kernels.cp_layer import LayerWeights
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.fused_qkv(), mlp.fused_gate_up()
    if qkv is None or gate_up is None:
        return None
    return LayerWeights(input_norm=layer.input_layernorm.weight, input_eps=layer.input_layernorm.eps, qkv=qkv,
                        q_norm=attn.q_norm.weight, q_eps=attn.q_norm.eps, k_norm=attn.k_norm.weight,
                        k_eps=attn.k_norm.eps, o=attn.o_proj.weight, post_norm=layer.post_attention_layernorm.weight,
                        post_eps=layer.post_attention_layernorm.eps, gate_up=gate_up, down=mlp.down_proj.weight,
                        num_heads=attn.num_heads, scale=attn.scale)
