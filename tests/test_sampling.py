"""Codebook-0 and code-predictor token selection (voxflow.models.qwen3_tts.sampling)."""
from __future__ import annotations

import pytest
import torch

from voxflow.models.qwen3_tts import sampling as S
from voxflow.models.qwen3_tts.config import GenerationDefaults

torch.set_num_threads(1)
V, EOS = S.TALKER_VOCAB, S.CODEC_EOS_ID
GREEDY = S.SamplingParams(do_sample=False, subtalker_do_sample=False)


def logits_favouring(ids, batch=1, value=50.0):
    x = torch.randn(batch, V, generator=torch.Generator().manual_seed(0))
    x[:, ids] = value
    return x


# ---- codebook 0 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("params", [GREEDY, S.SamplingParams(seed=3)])
def test_eos_masked_for_the_first_two_tokens(params):
    s = S.RequestSampler(params)
    logits = logits_favouring([EOS], value=1e4)
    first, second, third = (int(s.talker(logits)) for _ in range(3))
    assert first != EOS and second != EOS
    assert third == EOS


def test_suppressed_ids_are_never_chosen():
    # make every suppressed id overwhelmingly likely; only codes < 2048 (and EOS later) may come out
    logits = torch.zeros(8, V)
    logits[:, 2048:] = 100.0
    logits[:, EOS] = 0.0
    params = [S.SamplingParams(seed=i, temperature=5.0, top_k=0) for i in range(8)]
    s = S.BatchSampler(params)
    for _ in range(20):
        ids = s.talker(logits)
        assert not ((ids >= 2048) & (ids != EOS)).any()
    greedy = S.RequestSampler(GREEDY)
    assert int(greedy.talker(logits[0])) < 2048


def test_suppress_mask():
    m = S.suppress_mask()
    assert m.shape == (V,) and not m[:2048].any() and not m[EOS]
    assert m[2048:].sum() == V - 2048 - 1


def test_repetition_penalty_math():
    logits = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = S.apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 3.0, -1.0]]
    # a penalty of 1 leaves everything as is
    assert torch.equal(S.apply_repetition_penalty(logits, seen, torch.tensor([1.0])), logits)


def test_repetition_penalty_counts_distinct_generated_ids_only():
    s = S.RequestSampler(S.SamplingParams(do_sample=False, repetition_penalty=2.0))
    logits = torch.zeros(V)
    logits[10], logits[11] = 4.0, 3.0
    assert int(s.talker(logits)) == 10          # 4 vs 3
    assert int(s.talker(logits)) == 11          # 4/2 = 2 < 3
    assert int(s.talker(logits)) == 10          # 2 vs 1.5 (penalised once each, not per occurrence)
    assert s.num_generated.tolist() == [3] and s.seen[0].nonzero().flatten().tolist() == [10, 11]


def test_top_k_keeps_exactly_k():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(1))
    top_k = torch.tensor([1, 7, 50, 0, 5000])
    kept = torch.isfinite(S.apply_top_k(logits, top_k)).sum(-1).tolist()
    assert kept == [1, 7, 50, V, V]
    out = S.apply_top_k(logits, top_k)
    assert torch.equal(out[2][torch.isfinite(out[2])].sort().values, logits[2].topk(50).values.sort().values)


def test_top_p_rule():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = S.apply_top_p(probs.log(), torch.tensor([0.75], dtype=torch.float64))
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    out = S.apply_top_p(probs.log(), torch.tensor([0.0], dtype=torch.float64))   # keeps at least one
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]
    out = S.apply_top_p(probs.log(), torch.tensor([1.0], dtype=torch.float64))   # disabled
    assert torch.equal(out, probs.log())


def test_temperature_scales_rows_independently():
    logits = torch.ones(2, 4)
    out = S.apply_temperature(logits, torch.tensor([0.5, 2.0]))
    assert out[:, 0].tolist() == [2.0, 0.5]


def test_greedy_is_argmax_of_processed_logits():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, V, generator=g) * 3
    seen = torch.zeros(3, V, dtype=torch.bool)
    seen[:, logits[0].argmax()] = True
    nums, pen, mins = torch.tensor([0, 1, 5]), torch.full((3,), 1.05), torch.full((3,), 2)
    params = S.WarpParams.build([False] * 3, [0.9] * 3, [50] * 3, [1.0] * 3, "cpu")
    ids = S.sample_talker(logits, seen, nums, pen, mins, S.suppress_mask(), params)
    processed = S.process_talker_logits(logits, seen, nums, pen, mins, S.suppress_mask())
    assert torch.equal(ids, processed.argmax(-1))
    # code predictor greedy: argmax of the raw logits, whatever the sampling settings say
    cp = S.WarpParams.build([False] * 3, [0.1] * 3, [1] * 3, [0.1] * 3, "cpu")
    raw = torch.randn(3, 2048, generator=g)
    assert torch.equal(S.sample_code_predictor(raw, cp), raw.argmax(-1))


# ---- randomness ----------------------------------------------------------------------------------
def run(params_list, frames=4, seed=0):
    """A fake decode loop with fixed logits: returns the c0 and residual draws per request."""
    g = torch.Generator().manual_seed(seed)
    s = S.BatchSampler(params_list)
    b = len(params_list)
    out = []
    for _ in range(frames):
        t_logits = torch.randn(1, V, generator=g).expand(b, V)
        row = [s.talker(t_logits)]
        for j in range(15):
            row.append(s.code_predictor(torch.randn(1, 2048, generator=g).expand(b, 2048), j))
        out.append(torch.stack(row, 1))
    return torch.stack(out, 1)  # [B, frames, 16]


def test_same_seed_same_samples_and_different_seed_differs():
    a = run([S.SamplingParams(seed=11, top_k=0, subtalker_top_k=0, temperature=2.0, subtalker_temperature=2.0)])
    b = run([S.SamplingParams(seed=11, top_k=0, subtalker_top_k=0, temperature=2.0, subtalker_temperature=2.0)])
    c = run([S.SamplingParams(seed=12, top_k=0, subtalker_top_k=0, temperature=2.0, subtalker_temperature=2.0)])
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_a_rows_samples_do_not_depend_on_the_rest_of_the_batch():
    mine = S.SamplingParams(seed=5, top_k=0, temperature=1.5, subtalker_top_p=0.95)
    alone = run([mine])
    others = [S.SamplingParams(seed=99), GREEDY, S.SamplingParams(seed=7, top_p=0.5)]
    together = run(others[:2] + [mine] + others[2:])
    assert torch.equal(together[2], alone[0])
    assert torch.equal(together[1], run([GREEDY])[0])


def test_greedy_rows_draw_no_random_numbers():
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    s = S.BatchSampler([GREEDY, S.SamplingParams()], generators=[gen, None])
    s.talker(torch.randn(2, V))
    s.code_predictor(torch.randn(2, 2048), 0)
    assert torch.equal(gen.get_state(), state)


def test_seeded_draw_equals_torch_multinomial_on_the_processed_distribution():
    # Documents the reference draw: softmax of the warped logits, one torch.multinomial call per row.
    p = S.SamplingParams(seed=42, temperature=0.7, top_k=20, top_p=0.9)
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3)) * 2
    got = S.RequestSampler(p).talker(logits)
    processed = S.process_talker_logits(logits, torch.zeros(1, V, dtype=torch.bool), torch.zeros(1, dtype=torch.long),
                                        torch.tensor([1.05]), torch.tensor([2]), S.suppress_mask())
    warped = S.warp_logits(processed, S.WarpParams.build([True], [0.7], [20], [0.9], "cpu"))
    expect = torch.multinomial(torch.softmax(warped, -1), 1, generator=torch.Generator().manual_seed(42))[0]
    assert torch.equal(got, expect)
    assert torch.isfinite(warped).sum() <= 20


# ---- bookkeeping ---------------------------------------------------------------------------------
def test_select_rows_keeps_state():
    s = S.BatchSampler([S.SamplingParams(seed=1, repetition_penalty=1.2), GREEDY, S.SamplingParams(seed=2)])
    s.talker(torch.randn(3, V))
    seen_row2 = s.seen[2].clone()
    s.select_rows([2, 0])
    assert len(s) == 2 and torch.equal(s.seen[0], seen_row2)
    assert s.penalty.tolist() == pytest.approx([1.05, 1.2])
    assert s.talker(torch.randn(2, V)).shape == (2,)


def test_validation_and_defaults():
    with pytest.raises(ValueError):
        S.SamplingParams(temperature=0.0).validate()
    with pytest.raises(ValueError):
        S.SamplingParams(subtalker_top_p=1.5).validate()
    with pytest.raises(ValueError):
        S.SamplingParams(top_k=-1).validate()
    S.SamplingParams(do_sample=False, temperature=0.0).validate()  # greedy ignores the temperature
    p = S.SamplingParams.from_defaults(GenerationDefaults(top_p=0.8), seed=3)
    assert (p.top_p, p.temperature, p.repetition_penalty, p.seed, p.min_new_tokens) == (0.8, 0.9, 1.05, 3, 2)


def test_warp_hints_skip_work_without_changing_results():
    """The engine's host-side hints (a top-k bound -> `topk` instead of a full sort; no top-p in use -> the
    stage skipped) give exactly the logits of the plain warp for every sampling row."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=g) * 3
    logits[0, :40] = 1.0                                           # ties at the top-k boundary
    top_k = [1, 7, 50, 33, 50, 12]
    plain = S.WarpParams.build([True] * 6, [0.7, 1.0, 0.9, 1.3, 0.5, 1.0], top_k, [1.0] * 6, "cpu")
    hinted = S.WarpParams.build([True] * 6, [0.7, 1.0, 0.9, 1.3, 0.5, 1.0], top_k, [1.0] * 6, "cpu")
    hinted.top_k_max, hinted.any_top_p = 64, False
    assert torch.equal(S.warp_logits(logits, plain), S.warp_logits(logits, hinted))
    with_p = S.WarpParams.build([True] * 6, [1.0] * 6, top_k, [1.0, 0.8, 0.95, 1.0, 0.5, 0.99], "cpu")
    expected = S.warp_logits(logits, with_p)
    with_p.top_k_max = 50
    assert torch.equal(S.warp_logits(logits, with_p), expected)
    # a bound below some row's k is a lie the caller must not tell: that row's filter differs
    wrong = S.WarpParams.build([True] * 6, [0.7, 1.0, 0.9, 1.3, 0.5, 1.0], top_k, [1.0] * 6, "cpu")
    wrong.top_k_max = 8
    assert not torch.equal(S.warp_logits(logits, wrong), S.warp_logits(logits, plain))
