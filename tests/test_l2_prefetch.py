"""voxflow/kernels/l2_prefetch.py off the GPU: the chunking covers a matrix in 16-byte multiples, nothing is issued
for CPU tensors, and the code predictor's hook brings in the blob `AHEAD` kernels ahead of each fused-layer kernel,
cycling into the next pass (the same matrices). The kernel itself compiles for sm_90 (test_kernels_compile.py's
`l2_prefetch` case); its GPU test is tests/gpu/test_gpu_l2_prefetch.py."""
from types import SimpleNamespace

import pytest
import torch

from voxflow.kernels import l2_prefetch


@pytest.mark.parametrize("nbytes,programs", [(16, 2), (12_582_912, 2), (4_194_320, 3), (33_554_432, 1)])
def test_chunks_cover_the_matrix_in_multiples_of_16(nbytes, programs):
    chunk = l2_prefetch.chunking(nbytes, programs)
    assert chunk % 16 == 0
    assert programs * 128 * chunk >= nbytes
    assert programs * 128 * (chunk - 16) < nbytes or chunk == 16      # no larger than it needs to be


def test_nothing_is_issued_for_cpu_tensors(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "AHEAD", 2)
    assert not l2_prefetch.applies(torch.zeros(4))
    assert l2_prefetch.WeightPrefetch().issue(torch.zeros(64)) is False


def test_the_code_predictor_hook_prefetches_ahead_cyclically(monkeypatch):
    from voxflow.models.qwen3_tts.code_predictor import CodePredictor
    from voxflow.models.qwen3_tts.config import CodePredictorConfig
    issued = []

    class Recorder:
        def issue(self, w):
            issued.append(w)
            return True

    monkeypatch.setattr(l2_prefetch, "AHEAD", 2)
    monkeypatch.setattr(l2_prefetch, "applies", lambda t: True)
    monkeypatch.setattr(l2_prefetch, "WeightPrefetch", Recorder)
    cfg = CodePredictorConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=16, vocab_size=16, num_code_groups=4,
                              rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=64)
    cp = CodePredictor(cfg, talker_hidden_size=32)
    blobs = [torch.zeros(1) for _ in range(8)]
    weights = [SimpleNamespace(qkv=blobs[4 * i], o=blobs[4 * i + 1], gate_up=blobs[4 * i + 2], down=blobs[4 * i + 3])
               for i in range(2)]
    rows = torch.zeros(1, 32)

    def which():                                    # by identity (the blobs are equal tensors)
        return [next(i for i, b in enumerate(blobs) if b is w) for w in issued]
    hook = cp._prefetch_hook(weights, rows)
    assert which() == [0, 1]                    # the frame's first pass: the first two up front
    issued.clear()
    for layer in range(2):
        for k in range(4):
            hook(4 * layer, k)
    assert which() == [2, 3, 4, 5, 6, 7, 0, 1]      # wraps into the next pass
    issued.clear()
    cp._prefetch_hook(weights, rows)                # a later pass of the same frame: nothing up front
    assert issued == []
