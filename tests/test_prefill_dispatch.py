"""How a step's prefill chunks are cut into graph replays (prefill_dispatch.cheapest_runs): the cut of least cost
(padded positions of each graph + a fixed cost per replay), checked against every possible cut of small steps."""
from __future__ import annotations

import itertools
import random
import types

from voxflow.engine.prefill_dispatch import EAGER_COST, EXACT_MAX_CHUNKS, REPLAY_COST, PrefillDispatch
from voxflow.engine.prefill_runner import PrefillRunner


def dispatch(max_tokens: int = 2048, max_batch: int = 64) -> PrefillDispatch:
    runner = PrefillRunner(types.SimpleNamespace(device="cpu"), None, None, block_size=16, scratch_block=0,
                           max_tokens=max_tokens, max_batch=max_batch, cuda_graphs=False)
    return PrefillDispatch(None, None, None, None, 16, 0, runner, batch_prefill=True)


def cost(d: PrefillDispatch, spans, runs) -> float:
    total = 0.0
    for key, idx in runs:
        if key is None:
            assert len(idx) == 1
            total += EAGER_COST + spans[idx[0]][1] - spans[idx[0]][0]
        else:
            part = [spans[i] for i in idx]
            assert key == d.runner.plan(part)                      # the graph is the one that holds the run
            total += key[0] * key[1] + REPLAY_COST
    return total


def all_cuts(d: PrefillDispatch, spans):
    """Every split of spans into consecutive runs, each with its graph (or eager when alone and too large)."""
    n = len(spans)
    for bits in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, b in enumerate(bits) if b] + [n]
        runs = []
        for a, b in zip(bounds, bounds[1:]):
            key = d.runner.plan(spans[a:b])
            if key is None and b - a > 1:
                break
            runs.append((key, list(range(a, b))))
        else:
            yield runs


def test_short_prompts_are_not_padded_to_a_long_one():
    d = dispatch()
    spans = [(0, 30), (0, 30), (0, 30), (0, 200)]
    runs = d.cheapest_runs(spans)
    assert [idx for _, idx in runs] == [[0, 1, 2], [3]]
    assert runs[0][0][:2] == (4, 32) and runs[1][0][:2] == (1, 256)
    # filling one graph with all four (what the dispatcher did before) pads them to 4 x 256
    assert cost(d, spans, runs) < cost(d, spans, [(d.runner.plan(spans), [0, 1, 2, 3])])


def test_the_cut_is_the_cheapest_of_all_cuts():
    d = dispatch(max_tokens=512, max_batch=8)
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 7)
        spans = sorted(((s := rng.choice([0, 0, 48])), s + rng.randint(1, 300)) for _ in range(n))
        spans.sort(key=lambda sp: sp[1] - sp[0])
        runs = d.cheapest_runs(spans)
        assert [i for _, idx in runs for i in idx] == list(range(n))        # each chunk once, in order
        assert cost(d, spans, runs) == min(cost(d, spans, cut) for cut in all_cuts(d, spans))


def test_a_chunk_no_graph_holds_runs_alone_and_eagerly():
    d = dispatch(max_tokens=512)
    runs = d.cheapest_runs([(0, 20), (0, 900), (0, 25)])
    assert runs[1] == (None, [1])
    assert [idx for _, idx in runs] == [[0], [1], [2]]


def test_many_short_chunks_fill_graphs_in_turn():
    """Past EXACT_MAX_CHUNKS (prefix-cache hits: many short chunks) each graph is filled in turn: every chunk once,
    in order, each run in the graph that holds it, a chunk no graph holds alone and eager."""
    d = dispatch(max_tokens=2048, max_batch=64)
    spans = [(100, 112)] * 40 + [(0, 3000)] + [(200, 230)] * 30
    assert len(spans) > EXACT_MAX_CHUNKS
    runs = d.cheapest_runs(spans)
    assert [i for _, idx in runs for i in idx] == list(range(len(spans)))
    assert [len(idx) for _, idx in runs] == [40, 1, 30] and runs[1][0] is None
    for key, idx in (runs[0], runs[2]):
        assert key == d.runner.plan([spans[i] for i in idx])
