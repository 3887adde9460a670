"""Token selection for Qwen3-TTS, batched over requests with per-request settings.

Codebook 0 (the talker, vocabulary 3072), in the reference order (transformers 4.57.3 as driven by the
official `generate`):
    1. repetition penalty over the distinct c0 ids this request generated so far
       (logit < 0 ? logit * p : logit / p); the prompt contributes no ids;
    2. EOS forced to -inf while fewer than `min_new_tokens` (2) c0 tokens have been generated;
    3. ids 2048..3071 except EOS forced to -inf (only real codes and EOS can be chosen);
    then, when sampling: 4. temperature, 5. top-k, 6. top-p (each skipped when disabled), softmax, one
    multinomial draw. Greedy = argmax after steps 1-3 (no temperature / top-k / top-p).
Codebooks 1..15 (the code predictor, vocabulary 2048): sampling = temperature, top-k, top-p, softmax,
multinomial; greedy = argmax of the raw logits.

Everything works on [B, V] fp32 logits with per-row parameter tensors, so the engine can run one batch of
requests with different settings on the device. Filtered logits are -inf, as in transformers.

Randomness: each request owns an optional `torch.Generator` (seeded => reproducible whatever else is in
the batch); rows without one use torch's global RNG. Greedy rows draw nothing. Per request the draw order
is: 1 talker draw for frame 0 after the prefill, then for each frame k: 15 code-predictor draws
(codebooks 1..15 of frame k), then 1 talker draw (c0 of frame k+1). With a generator seeded with s, a
single request consumes random numbers exactly like the official code after `torch.manual_seed(s)`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

CODEBOOK_SIZE = 2048
TALKER_VOCAB = 3072
CODEC_EOS_ID = 2150


# --------------------------------------------------------------------------------------------------
# Per-request settings
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    """One request's settings; the defaults are those of the released generation_config.json."""
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50            # 0 disables
    top_p: float = 1.0         # 1.0 disables
    repetition_penalty: float = 1.05   # 1.0 disables
    min_new_tokens: int = 2
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: int | None = None

    @classmethod
    def from_defaults(cls, gen, **overrides) -> "SamplingParams":
        """From a config.GenerationDefaults (generation_config.json), then explicit overrides."""
        base = cls(do_sample=gen.do_sample, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
                   repetition_penalty=gen.repetition_penalty, subtalker_do_sample=gen.subtalker_dosample,
                   subtalker_temperature=gen.subtalker_temperature, subtalker_top_k=gen.subtalker_top_k,
                   subtalker_top_p=gen.subtalker_top_p)
        return replace(base, **overrides)

    def validate(self) -> None:
        """Same acceptance rules as transformers' warpers (only for the stages that sample)."""
        stages = []
        if self.do_sample:
            stages.append(("", self.temperature, self.top_k, self.top_p))
        if self.subtalker_do_sample:
            stages.append(("subtalker_", self.subtalker_temperature, self.subtalker_top_k, self.subtalker_top_p))
        for prefix, temperature, top_k, top_p in stages:
            if not temperature > 0:
                raise ValueError(f"{prefix}temperature must be > 0 when sampling (got {temperature}); "
                                 "for greedy decoding set greedy (`greedy: true` over HTTP, --greedy in the CLI)")
            if int(top_k) != top_k or top_k < 0:
                raise ValueError(f"{prefix}top_k must be an integer >= 0 (got {top_k})")
            if not 0.0 <= top_p <= 1.0:
                raise ValueError(f"{prefix}top_p must be in [0, 1] (got {top_p})")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (got {self.repetition_penalty})")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0 (got {self.min_new_tokens})")

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(int(self.seed))


@dataclass
class WarpParams:
    """Per-row settings of one sampling stage (talker or code predictor), as [B] tensors."""
    do_sample: torch.Tensor     # bool
    temperature: torch.Tensor   # float32
    top_k: torch.Tensor         # int64, 0 = off
    top_p: torch.Tensor         # float64 (kept in double so 1 - top_p rounds like transformers'), 1 = off
    # Host-side knowledge that lets the batched engine skip work (results are identical either way):
    top_k_max: int | None = None    # every SAMPLING row has 0 < top_k <= this: top-k from `topk`, not a full sort
    any_top_p: bool = True          # False: no sampling row uses top-p, the stage is skipped

    @classmethod
    def build(cls, do_sample, temperature, top_k, top_p, device) -> "WarpParams":
        do_sample = [bool(d) for d in do_sample]
        # Greedy rows never use the warped logits; a neutral temperature keeps them finite (e.g. t = 0).
        temperature = [t if d else 1.0 for t, d in zip(temperature, do_sample)]
        return cls(do_sample=torch.tensor(do_sample, dtype=torch.bool, device=device),
                   temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
                   top_k=torch.tensor([int(k) for k in top_k], dtype=torch.long, device=device),
                   top_p=torch.tensor(list(top_p), dtype=torch.float64, device=device))

    def select_rows(self, rows: torch.Tensor) -> "WarpParams":
        return WarpParams(*(t.index_select(0, rows) for t in
                            (self.do_sample, self.temperature, self.top_k, self.top_p)),
                          top_k_max=self.top_k_max, any_top_p=self.any_top_p)


# --------------------------------------------------------------------------------------------------
# Logit processing (each function returns a new tensor; inputs [B, V])
# --------------------------------------------------------------------------------------------------
def suppress_mask(vocab_size: int = TALKER_VOCAB, eos_id: int = CODEC_EOS_ID, num_codes: int = CODEBOOK_SIZE,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """[V] bool: True for the talker ids that may never be generated (everything past the codebook but EOS)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[num_codes:] = True
    mask[eos_id] = False
    return mask


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """seen [B, V] bool marks the ids each row generated; penalty [B] (1.0 = no change)."""
    p = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalised, logits)


def apply_min_new_tokens(logits: torch.Tensor, num_generated: torch.Tensor, min_new_tokens: torch.Tensor,
                         eos_id: int = CODEC_EOS_ID) -> torch.Tensor:
    """EOS -> -inf in the rows that have generated fewer than min_new_tokens tokens."""
    too_early = num_generated < min_new_tokens
    out = logits.clone()
    out[:, eos_id] = torch.where(too_early, torch.full_like(out[:, eos_id], float("-inf")), out[:, eos_id])
    return out


def apply_suppression(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(mask, float("-inf"))


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return logits / temperature.to(logits.dtype)[:, None]


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, k_max: int | None = None) -> torch.Tensor:
    """Keep, per row, the logits >= the k-th largest (ties at the boundary survive, as in transformers).

    k = 0 disables the filter for that row (the threshold becomes the row minimum, which removes nothing).
    k_max: a bound on k over the rows that matter: the k_max largest (`topk`, much cheaper than sorting the whole
    vocabulary) hold every threshold; rows with a larger k get a meaningless threshold and must be ignored.
    """
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(1, vocab)
    if k_max is not None and 0 < k_max < vocab:
        ranked = torch.topk(logits, k_max, dim=-1).values
        k = k.clamp(max=k_max)
    else:
        ranked = torch.sort(logits, dim=-1, descending=True).values
    threshold = ranked.gather(-1, (k - 1)[:, None])
    return logits.masked_fill(logits < threshold, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter with transformers' exact rule: sort ascending, drop the tokens whose cumulative
    probability is <= 1 - top_p, always keep the most likely one. Rows with top_p >= 1 are untouched."""
    ascending, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    # 1 - top_p is formed in double and rounded once, exactly like transformers' Python-float threshold.
    cut = (1.0 - top_p.to(torch.float64)).to(logits.dtype)[:, None]
    drop_sorted = cumulative <= cut
    drop_sorted[:, -1] = False
    drop_sorted &= (top_p < 1.0)[:, None]
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def warp_logits(logits: torch.Tensor, params: WarpParams) -> torch.Tensor:
    """Temperature, top-k, top-p (the sampling-only stages)."""
    logits = apply_temperature(logits, params.temperature)
    logits = apply_top_k(logits, params.top_k, params.top_k_max)
    return apply_top_p(logits, params.top_p) if params.any_top_p else logits


def process_talker_logits(logits: torch.Tensor, seen: torch.Tensor, num_generated: torch.Tensor,
                          penalty: torch.Tensor, min_new_tokens: torch.Tensor, suppress: torch.Tensor,
                          eos_id: int = CODEC_EOS_ID) -> torch.Tensor:
    """Steps 1-3 for codebook 0 (applied for greedy and sampled rows alike); fp32 out."""
    logits = logits.to(torch.float32)
    logits = apply_repetition_penalty(logits, seen, penalty)
    logits = apply_min_new_tokens(logits, num_generated, min_new_tokens, eos_id)
    return apply_suppression(logits, suppress)


# --------------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------------
def draw(greedy_logits: torch.Tensor, sample_logits: torch.Tensor, do_sample: torch.Tensor,
         generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
    """ids [B]: argmax of `greedy_logits` for greedy rows, one multinomial draw from softmax(`sample_logits`)
    for sampling rows, with the row's own generator (or the global RNG when it has none)."""
    ids = greedy_logits.argmax(dim=-1)
    rows = torch.nonzero(do_sample).flatten().tolist()
    if not rows:
        return ids
    probs = torch.softmax(sample_logits, dim=-1)
    if generators is None or all(generators[r] is None for r in rows):
        # One call for the whole group: what transformers does for a batch on the global RNG.
        picked = torch.multinomial(probs[rows], num_samples=1).squeeze(1)
        ids[rows] = picked
        return ids
    for r in rows:
        ids[r] = torch.multinomial(probs[r:r + 1], num_samples=1, generator=generators[r])[0, 0]
    return ids


def sample_talker(logits: torch.Tensor, seen: torch.Tensor, num_generated: torch.Tensor, penalty: torch.Tensor,
                  min_new_tokens: torch.Tensor, suppress: torch.Tensor, params: WarpParams,
                  generators: Sequence[torch.Generator | None] | None = None,
                  eos_id: int = CODEC_EOS_ID) -> torch.Tensor:
    """c0 ids [B] from talker logits [B, 3072]. Does not update `seen`/`num_generated` (see `record`)."""
    processed = process_talker_logits(logits, seen, num_generated, penalty, min_new_tokens, suppress, eos_id)
    if not bool(params.do_sample.any()):
        return processed.argmax(dim=-1)
    return draw(processed, warp_logits(processed, params), params.do_sample, generators)


def sample_code_predictor(logits: torch.Tensor, params: WarpParams,
                          generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
    """Residual code ids [B] from code-predictor logits [B, 2048]."""
    logits = logits.to(torch.float32)
    if not bool(params.do_sample.any()):
        return logits.argmax(dim=-1)
    return draw(logits, warp_logits(logits, params), params.do_sample, generators)


def record(seen: torch.Tensor, num_generated: torch.Tensor, ids: torch.Tensor) -> None:
    """Note freshly generated c0 ids (in place) for the repetition penalty and the min-length rule."""
    seen.scatter_(1, ids[:, None].to(torch.long), True)
    num_generated += 1


# --------------------------------------------------------------------------------------------------
# Stateful helpers
# --------------------------------------------------------------------------------------------------
class BatchSampler:
    """The sampling state of a batch of requests: settings, generators, c0 history.

    `talker(logits [B, 3072]) -> c0 [B]` (and records it); `code_predictor(logits [B, 2048], j) -> [B]`
    has the `sample_fn` signature expected by `CodePredictor.predict`.
    """

    def __init__(self, params: Sequence[SamplingParams], device: torch.device | str = "cpu",
                 vocab_size: int = TALKER_VOCAB, eos_id: int = CODEC_EOS_ID, num_codes: int = CODEBOOK_SIZE,
                 generators: Sequence[torch.Generator | None] | None = None):
        for p in params:
            p.validate()
        self.eos_id = eos_id
        self.generators = list(generators) if generators is not None else [p.make_generator(device) for p in params]
        if len(self.generators) != len(params):
            raise ValueError("need one generator (or None) per request")
        self.talker_params = WarpParams.build([p.do_sample for p in params], [p.temperature for p in params],
                                              [p.top_k for p in params], [p.top_p for p in params], device)
        self.cp_params = WarpParams.build([p.subtalker_do_sample for p in params],
                                          [p.subtalker_temperature for p in params],
                                          [p.subtalker_top_k for p in params],
                                          [p.subtalker_top_p for p in params], device)
        self.penalty = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)
        self.min_new_tokens = torch.tensor([p.min_new_tokens for p in params], dtype=torch.long, device=device)
        self.suppress = suppress_mask(vocab_size, eos_id, num_codes, device)
        self.seen = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
        self.num_generated = torch.zeros(len(params), dtype=torch.long, device=device)

    def __len__(self) -> int:
        return self.seen.shape[0]

    def talker(self, logits: torch.Tensor) -> torch.Tensor:
        ids = sample_talker(logits, self.seen, self.num_generated, self.penalty, self.min_new_tokens,
                            self.suppress, self.talker_params, self.generators, self.eos_id)
        record(self.seen, self.num_generated, ids)
        return ids

    def code_predictor(self, logits: torch.Tensor, j: int) -> torch.Tensor:
        return sample_code_predictor(logits, self.cp_params, self.generators)

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only these requests (in this order), e.g. after some finished."""
        rows_t = torch.as_tensor(rows, dtype=torch.long, device=self.seen.device)
        rows_l = rows_t.tolist()
        self.generators = [self.generators[r] for r in rows_l]
        self.talker_params = self.talker_params.select_rows(rows_t)
        self.cp_params = self.cp_params.select_rows(rows_t)
        self.penalty = self.penalty.index_select(0, rows_t)
        self.min_new_tokens = self.min_new_tokens.index_select(0, rows_t)
        self.seen = self.seen.index_select(0, rows_t)
        self.num_generated = self.num_generated.index_select(0, rows_t)


class RequestSampler(BatchSampler):
    """A batch of one; `talker` and `code_predictor` accept [V] or [1, V] logits."""

    def __init__(self, params: SamplingParams = SamplingParams(), device: torch.device | str = "cpu", **kw):
        super().__init__([params], device, **kw)

    def talker(self, logits: torch.Tensor) -> torch.Tensor:
        return super().talker(logits.reshape(1, -1))

    def code_predictor(self, logits: torch.Tensor, j: int) -> torch.Tensor:
        return super().code_predictor(logits.reshape(1, -1), j)
