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

from typing import Callable

import torch
from torch import nn

from voxflow.layers.attention import KVCache
from voxflow.layers.qwen3_layer import Qwen3DecoderStack
from voxflow.models.qwen3_tts.config import CodePredictorConfig

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

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def embed_residual(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [..., 15] (codebooks 1..15) -> their input embeddings [..., 15, H_talker]."""
        return torch.stack([self.model.codec_embedding[g](codes[..., g]) for g in range(self.num_residual)],
                           dim=-2)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None
                ) -> torch.Tensor:
        """inputs_embeds [B, S, H_talker] -> normed hidden [B, S, H_cp]. No padding: every row of a
        code-predictor batch is at the same step."""
        return self.model(self.small_to_mtp_projection(inputs_embeds), positions, cache)

    @torch.no_grad()
    def predict(self, h_last: torch.Tensor, c0_embed: torch.Tensor, sample_fn: SampleFn
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One frame's residual codes.

        h_last [B, H]: talker hidden state (after its final norm) at the position that produced c0.
        c0_embed [B, H]: the talker's codec embedding of c0.
        Returns codes [B, 15] (codebooks 1..15) and the raw logits [B, 15, vocab] each was drawn from.
        """
        b = h_last.shape[0]
        device = h_last.device
        cache = self.new_cache()
        x = torch.stack((h_last, c0_embed), dim=1)
        positions = torch.arange(2, device=device).expand(b, 2)
        hidden = self(x, positions, cache)
        # The head runs on both prefill positions, as the reference does, so its GEMM has the same shape.
        step_logits = self.lm_head[0](hidden)[:, -1]
        codes, logits = [], []
        for j in range(self.num_residual):
            if j > 0:
                x = self.model.codec_embedding[j - 1](codes[-1])[:, None]
                positions = torch.full((b, 1), j + 1, dtype=torch.long, device=device)
                step_logits = self.lm_head[j](self(x, positions, cache))[:, -1]
            logits.append(step_logits)
            codes.append(sample_fn(step_logits, j).to(torch.long))
        return torch.stack(codes, dim=1), torch.stack(logits, dim=1)
