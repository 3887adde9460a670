"""The Qwen3-TTS talker: a Qwen3 decoder over summed text/codec embeddings that predicts codebook 0.

Inputs are embeddings, never ids: each prompt position is a text embedding (through `text_projection`),
a codec embedding, or their sum, and each generated frame is fed back as the sum of its 16 code
embeddings (`embed_frame`) plus the next trailing-text embedding (built by the caller).
Output: hidden states after the final norm; `codec_logits` maps them to the 3072-way codec vocabulary
(2048 codes + control tokens). Frame k's codes 1..15 come from the code predictor (`predict_residual_codes`).

State-dict keys equal the checkpoint's `talker.*` keys with `talker.` removed: `model.layers.*`,
`model.norm`, `model.codec_embedding`, `model.text_embedding`, `text_projection.linear_fc{1,2}`,
`codec_head`, `code_predictor.*`.

Positions: RoPE positions are cumsum(attention_mask) - 1 (see `positions_from_mask`), so a left-padded
row behaves as if unpadded, and decode positions continue from each row's own length. The config's
interleaved MRoPE with three identical position rows reduces exactly to this plain RoPE.
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.engine.host_to_device import to_device
from voxflow.kernels import use_kernels
from voxflow.layers.attention import KVCache
from voxflow.layers import qwen3_layer
from voxflow.layers.qwen3_layer import Qwen3DecoderStack, positions_from_mask
from voxflow.models.qwen3_tts.code_predictor import CodePredictor, SampleFn
from voxflow.models.qwen3_tts.config import TalkerConfig
from voxflow.models.qwen3_tts.text_rows import ProjectedTextRows

__all__ = ["Talker", "TalkerBackbone", "TextProjection", "positions_from_mask"]

# The decode step's codec_head at one row through the skinny GEMM (programmatic dependent launch, and the weight
# preload at the 1.7B's widths: both cuBLAS lacks, so the token draw after it can start early) instead of cuBLAS
# (H200 session 30: 5.9 us on the c=1 step's critical path, outside the PDL chain). The same products in fp32,
# another summation order. H200 session 31 call 2 (1.7B c=1 bench): E2E 487.0 -> 486.1 ms; the fp32 engine's codes
# still equal the CPU reference's. VOXFLOW_SKINNY_CODEC_HEAD=0 turns it off.
SKINNY_CODEC_HEAD = os.environ.get("VOXFLOW_SKINNY_CODEC_HEAD", "1") == "1"


class TextProjection(nn.Module):
    """text_hidden -> text_hidden -> H, SiLU in between, both Linear layers with bias."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(Qwen3DecoderStack):
    """Decoder stack plus the codec [3072, H] and text [151936, text_hidden] embedding tables."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        if cfg.code_predictor is None:
            raise ValueError("TalkerConfig has no code_predictor config")
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.hidden_size)
        # Prompt embeddings of fixed id lists (special tokens, role, language / speaker codec rows), kept by
        # prompt.build_prompt under weights_version(): a request then embeds only its own text.
        self.prompt_constants: dict = {}
        # Prompt builds take projected text rows kept per token id (text_rows.py). None: on a GPU only — there the
        # per-request projection is what a build costs; on a CPU the builder's grouped calls keep the prompt
        # bit-identical to the official code's (a kept row was computed in another batch, equal up to rounding).
        self.keep_text_rows: bool | None = None
        self._text_rows: ProjectedTextRows | None = None

    def keeps_text_rows(self) -> bool:
        return self.keep_text_rows if self.keep_text_rows is not None else self.device.type == "cuda"

    def text_rows(self, ids) -> torch.Tensor | None:
        """embed_text of host token ids [N] -> [N, H] from the rows kept per id, or None when this talker does not
        keep them (the caller embeds the ids itself)."""
        if not self.keeps_text_rows():
            return None
        if self._text_rows is None:
            self._text_rows = ProjectedTextRows(self)
        return self._text_rows.rows(ids)

    def preload_text_rows(self) -> dict:
        """Project every text token id now and keep the rows (text_rows.py, preload): prompt builds then only gather.
        Turns keeping rows on. Returns what it made, for the engine's startup record: the table's device bytes and
        the seconds it took."""
        def preload() -> None:
            self._text_rows = ProjectedTextRows(self, preload=True)
        return self._make_text_rows(preload)

    def warm_text_rows(self, count: int) -> dict:
        """The first `count` text token ids' rows projected now and kept (text_rows.py, `warm`): what a server
        without the whole preloaded table (`preload_text_rows`) does at load. Turns keeping rows on. Returns what it
        made, for the engine's startup record: the ids, the table's device bytes and the seconds it took."""
        def warm() -> dict:
            if self._text_rows is None:
                self._text_rows = ProjectedTextRows(self)
            return {"ids": self._text_rows.warm(count)}
        return self._make_text_rows(warm)

    def _make_text_rows(self, make) -> dict:
        """Keeping rows on, `make()` run to its end on the device, timed: its record (if any) + bytes + seconds."""
        started = time.perf_counter()
        self.keep_text_rows = True
        made = make() or {}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {**made, "bytes": self._text_rows.table_bytes, "seconds": round(time.perf_counter() - started, 3)}

    def weights_version(self) -> tuple:
        """Changes when a prompt-embedding weight is replaced or changed in place (or moved / cast)."""
        return tuple((p.data_ptr(), p._version, p.dtype) for p in (
            self.model.text_embedding.weight, self.model.codec_embedding.weight, self.text_projection.linear_fc1.weight,
            self.text_projection.linear_fc1.bias, self.text_projection.linear_fc2.weight,
            self.text_projection.linear_fc2.bias))

    @property
    def device(self) -> torch.device:
        """Where the weights live (the prompt builder creates its id tensors here)."""
        return self.codec_head.weight.device

    # ---- embeddings -------------------------------------------------------------------------------
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids [...] -> [..., H] (on the device of the projection, whatever the ids' device).

        The table may live in host memory (Qwen3TTS.from_pretrained's text_embedding_device): the rows are gathered
        there and only they move to the device. Ids on the device are copied to the host first, a blocking copy:
        prompt builds hand host ids (text_rows.py)."""
        table = self.model.text_embedding.weight
        if table.device == self.device:
            return self.text_projection(self.model.text_embedding(ids))
        return self.text_projection(to_device(F.embedding(ids.to(table.device), table), self.device))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codec-vocabulary ids (codebook-0 codes, control tokens, language/speaker rows) [...] -> [..., H]."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """A frame's 16 codes [..., 16] -> the sum of their embeddings [..., H] (without the text part).

        Codebook 0 uses the talker's codec table, codebooks 1..15 the code predictor's tables. The 16 rows
        are stacked and reduced with one sum, as the reference does, so the fp32 rounding is the same.
        """
        parts = torch.cat((self.embed_codec(codes[..., 0]).unsqueeze(-2),
                           self.code_predictor.embed_residual(codes[..., 1:])), dim=-2)
        return parts.sum(dim=-2)

    # ---- decoder ----------------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """inputs_embeds [B, S, H], positions [B, S] -> hidden [B, S, H] after the final norm.

        cache: this batch's KVCache, appended to in place (prefill: a fresh one; decode: the same again).
        attention_mask: [B, cached + S], 1 for real tokens, 0 for left padding; None when unpadded.
        """
        return self.model(inputs_embeds, positions, cache, attention_mask)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., vocab_size (3072)].

        The reference applies the head to every prompt position and then takes the last one. Applying it
        to the last position only gives the same logits up to GEMM rounding (~1e-7 in fp32); pass the whole
        prefill hidden state when bit-exact parity with the reference matters. On the kernel path the skinny GEMM
        (the same products, another summation order) at one row with SKINNY_CODEC_HEAD, at 2..64 rows with
        qwen3_layer.SKINNY_HEADS.
        """
        w = self.codec_head.weight
        if hidden.dim() >= 2 and use_kernels(hidden):
            rows = hidden.reshape(-1, hidden.shape[-1])
            skinny = (SKINNY_CODEC_HEAD if rows.shape[0] == 1
                      else qwen3_layer.skinny_gemm_wanted(qwen3_layer.SKINNY_HEADS, rows))
            if skinny:
                return qwen3_layer.linear_rows(True, rows, w).view(*hidden.shape[:-1], w.shape[0])
        return self.codec_head(hidden)

    # ---- code predictor ---------------------------------------------------------------------------
    def predict_residual_codes(self, h_last: torch.Tensor, c0: torch.Tensor, sample_fn: SampleFn,
                               frame_embed: bool = False, embed_parts: bool = False):
        """h_last [B, H] (post-norm hidden that produced c0), c0 [B] -> codes [B, 15], logits [B, 15, 2048]
        (frame_embed: instead of the logits, embed_frame of the completed frame [B, H], from the pass's own lookups;
        embed_parts: its 16 rows unsummed where the draws make them, CodePredictor.predict)."""
        return self.code_predictor.predict(h_last, self.embed_codec(c0), sample_fn, frame_embed, embed_parts)
