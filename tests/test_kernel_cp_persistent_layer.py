"""The code predictor's one-launch layer step (voxflow/kernels/cp_persistent_layer.py) against the torch layer, on
the CPU under Triton's interpreter (in a subprocess, tests/interpreter_child.py).

The interpreter runs programs one after another, so the grid barriers cannot be taken here: the kernel runs its
phases as separate launches (PHASE = 1..6: the same tiles and arithmetic; tests/gpu/test_gpu_cp_persistent_layer.py
holds the one-launch path to them on the GPU). A grid of 3 programs makes each program stride over several tiles
and items of every phase. Also: a second layer fed the first one's sums of squares (`out.ssq`, what the code
predictor chains) gives what it gives taking them itself (fp32: the sums differ in order only).

Shapes: the tiny layer of tests/cp_layer_reference.py (hidden 64, 4 q / 2 kv heads of 32: attention output twice
the hidden size) at 1, 3 and 20 rows (20: a 32-row tile with 12 masked rows; also per-phase tile widths other than
the defaults), cache lengths 0, 5 and 15 (the last position); the real 1.7B code-predictor shapes at 2 rows.
Tolerances: tests/cp_layer_reference.check_layer_step (fp32 within 1e-5 of max |ref|; bf16 no worse than 1.5x the
torch layer's own bf16 error against fp32 plus 2^-9 of max |ref|; the cache: positions other than the new one
untouched, the new key / value as the torch layer's).
"""
from __future__ import annotations

import pytest
import torch

from cp_layer_reference import REAL, TINY, check_layer_step, make_layer  # tests/cp_layer_reference.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_CP_PERSISTENT_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
SMALL_GRID = dict(grid=3)


def step_with(config):
    from voxflow.kernels import cp_persistent_layer as pl

    def step(x, w, cos, sin, cache):
        assert pl.supported(x, w, cos, sin, cache.k, cache.v)
        return pl.layer_step(x, w, cos, sin, cache.k, cache.v, cache.claim(), config=config)
    return step


def check_cases(dtype):
    for m, length in ((1, 0), (3, 5), (20, 15)):
        check_layer_step(step_with(SMALL_GRID), TINY, dtype, m, length)
    check_layer_step(step_with(dict(grid=5, BN_QKV=16, BN_O=32, BN_GU=16, BN_DOWN=64, BK=32)), TINY, dtype, 3, 7)
    check_layer_step(step_with(dict(grid=16)), REAL, dtype, 2, 9)


@torch.no_grad()
def check_chained_sums_of_squares():
    from cp_layer_reference import make_cache
    from voxflow.kernels import cp_persistent_layer as pl
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    dtype, m, length = torch.float32, 5, 3
    w1, w2 = (_layer_weights(make_layer(TINY, dtype, seed)) for seed in (1, 2))
    cos, sin = RotaryEmbedding(TINY["head_dim"], 1e6, 64)._compute(torch.tensor([[length]]), dtype)
    x = torch.randn(m, TINY["hidden"], generator=torch.Generator().manual_seed(0)) * 4
    c1, c2, c3 = (make_cache(TINY, m, length, dtype, seed=s) for s in (1, 2, 2))
    h = pl.layer_step(x, w1, cos, sin, c1.k, c1.v, length, config=SMALL_GRID)
    assert h.ssq.shape == (TINY["hidden"] // 16, m)
    torch.testing.assert_close(h.ssq.sum(0), (h * h).sum(1), rtol=1e-6, atol=0)
    chained = pl.layer_step(h, w2, cos, sin, c2.k, c2.v, length, config=SMALL_GRID, ssq_in=h.ssq)
    alone = pl.layer_step(h.clone(), w2, cos, sin, c3.k, c3.v, length, config=SMALL_GRID)
    torch.testing.assert_close(chained, alone, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c2.k, c3.k, rtol=1e-6, atol=1e-6)


if IN_CHILD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_layer_step_matches_torch(dtype):
        check_cases(dtype)

    def test_child_chained_sums_of_squares():
        check_chained_sums_of_squares()
else:
    def test_cp_persistent_layer_under_the_interpreter_matches_torch():
        run_child(__file__, CHILD_FLAG)


# Validation runs before any launch: these need no interpreter (and run in both processes).

@torch.no_grad()
def test_supported_takes_the_real_shapes_up_to_64_rows_and_rejects_others():
    from cp_layer_reference import make_cache
    from voxflow.kernels import cp_persistent_layer as pl
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    layer = make_layer(REAL, torch.bfloat16)
    w = _layer_weights(layer)
    cos = sin = torch.zeros(1, 1, REAL["head_dim"], dtype=torch.bfloat16)
    cache = make_cache(REAL, 65, 0, torch.bfloat16)
    x = torch.zeros(65, REAL["hidden"], dtype=torch.bfloat16)
    assert pl.supported(x[:64], w, cos, sin, cache.k, cache.v)
    assert pl.supported(x[:1], w, cos, sin, cache.k, cache.v)
    assert not pl.supported(x, w, cos, sin, cache.k, cache.v)                               # 65 rows
    assert not pl.supported(x[:4].float(), w, cos, sin, cache.k, cache.v)                   # dtypes differ
    assert not pl.supported(x[:4], w, cos, sin, cache.k[:2], cache.v[:2])                   # cache rows < M
    with pytest.raises(ValueError, match="no room"):
        pl.layer_step(x[:4], w, cos, sin, cache.k, cache.v, REAL["cache"])
    with pytest.raises(ValueError, match="BN_O"):
        pl.layer_step(x[:4], w, cos, sin, cache.k, cache.v, 0, config=dict(BN_O=48))
    with pytest.raises(ValueError, match="unknown config"):
        pl.layer_step(x[:4], w, cos, sin, cache.k, cache.v, 0, config=dict(BLOCK_N=16))
    with pytest.raises(ValueError, match="ssq_in"):
        pl.layer_step(x[:4], w, cos, sin, cache.k, cache.v, 0, ssq_in=torch.zeros(64, 3))
