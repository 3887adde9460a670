"""Projected text rows kept per token id (qwen3_tts/text_rows.py) on the tiny fp32 talker, forced on (a GPU keeps
them by default, a CPU does not): the rows equal the per-request projection, hits project nothing, changed weights
and a full table start over, and a prompt built from kept rows equals the grouped build.

Tolerance: a kept row comes out of a GEMM over another batch of ids than the request's own, so it may differ in
summation order only: 1e-6 relative on these fp32 values (a wrong row, id or weight version is off by O(1))."""
import os

import numpy as np
import pytest
import torch

from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.prompt import PromptRequest, build_prompt
from voxflow.models.qwen3_tts.text_rows import ProjectedTextRows

TINY = os.environ["VOXFLOW_TINY_DIR"]


@pytest.fixture(scope="module")
def model():
    return Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"))


def direct(talker, ids) -> torch.Tensor:
    with torch.no_grad():
        return talker.embed_text(torch.tensor(ids, dtype=torch.long))


def close(a, b) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


def test_rows_equal_the_projection_and_hits_project_nothing(model):
    cache = ProjectedTextRows(model.talker)
    ids = [151644, 77091, 198, 9707, 11, 1879, 9707]                # repeats inside one request
    assert close(cache.rows(ids), direct(model.talker, ids))
    assert cache.projected == 6                                     # each distinct id once
    again = [9707, 198, 1879]
    assert close(cache.rows(again), direct(model.talker, again))
    assert cache.projected == 6
    more = [9707, 42, 43]
    assert close(cache.rows(more), direct(model.talker, more))
    assert cache.projected == 8
    assert cache.rows([]).shape == (0, model.config.talker.hidden_size)
    with pytest.raises(ValueError, match="out of range"):
        cache.rows([model.talker.model.text_embedding.num_embeddings])


def test_changed_weights_empty_the_table(model):
    talker = model.talker
    cache = ProjectedTextRows(talker)
    ids = [10, 20, 30]
    before = cache.rows(ids)
    w = talker.text_projection.linear_fc2.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(1.5)                                             # in place: only the version counter moves
        after = cache.rows(ids)
        assert close(after, direct(talker, ids))
        assert not close(after, before)
        assert cache.projected == 6
    finally:
        with torch.no_grad():
            w.copy_(saved)


def test_a_full_table_starts_over_and_a_request_larger_than_it_is_projected_directly(model):
    cache = ProjectedTextRows(model.talker, max_rows=4)
    assert close(cache.rows([1, 2, 3]), direct(model.talker, [1, 2, 3]))
    assert close(cache.rows([4, 5, 1]), direct(model.talker, [4, 5, 1]))     # 5 distinct > 4: start over
    assert cache.projected == 6
    wide = list(range(100, 106))
    assert close(cache.rows(wide), direct(model.talker, wide))              # 6 distinct ids, more than it keeps
    assert close(cache.rows([4, 5, 1]), direct(model.talker, [4, 5, 1]))
    assert cache.projected == 6                                             # the wide request kept nothing
    many = [4, 5] * 3                                                       # more ids than it keeps, 2 distinct
    assert close(cache.rows(many), direct(model.talker, many))
    assert cache.projected == 6                                             # from the table


@pytest.mark.parametrize("kw", [
    dict(text="Hello there, how are you?", speaker="vivian", language="english", non_streaming_mode=True),
    dict(text="Hello there, how are you?", speaker="vivian", language="english", non_streaming_mode=False),
    dict(text="x", speaker="ryan", language="auto", non_streaming_mode=False),
])
def test_prompt_from_kept_rows_equals_the_grouped_build(model, kw):
    talker = model.talker
    assert not talker.keeps_text_rows() and talker.text_rows([1]) is None   # on a CPU: none unless told to
    want = build_prompt(model.config, model.tokenizer, talker, PromptRequest(**kw))
    talker.keep_text_rows = True
    try:
        got = build_prompt(model.config, model.tokenizer, talker, PromptRequest(**kw))
        assert talker._text_rows is not None and talker._text_rows.projected > 0
    finally:
        talker.keep_text_rows = None
    assert close(got.inputs_embeds, want.inputs_embeds)
    assert close(got.trailing_text, want.trailing_text)
    assert np.isfinite(got.inputs_embeds.numpy()).all()


def test_a_table_in_host_memory_is_gathered_there_and_projected_on_the_talkers_device(monkeypatch):
    """text_embedding_on_host: the table stays in host memory while the rest of the talker sits on another device
    (here "meta", the one other device a CPU has: shapes, no values; the GPU test holds the values). The kept-rows
    path hands the table host ids (no copy to the device and back), and the projected rows land on the talker's
    device."""
    model = Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"))
    talker = model.talker
    table = talker.model.text_embedding.weight
    talker.to("meta")
    talker.model.text_embedding.weight = torch.nn.Parameter(table, requires_grad=False)
    assert talker.device.type == "meta"
    gathered = []
    real = torch.nn.functional.embedding
    monkeypatch.setattr(torch.nn.functional, "embedding",
                        lambda ids, weight, *a, **k: (gathered.append((ids.device.type, weight.device.type)),
                                                      real(ids, weight, *a, **k))[1])
    rows = ProjectedTextRows(talker).rows([9707, 11, 9707])
    assert rows.device.type == "meta" and rows.shape == (3, model.config.talker.hidden_size)
    assert gathered == [("cpu", "cpu")]
    assert direct(talker, [5, 6]).shape == (2, model.config.talker.hidden_size)     # host ids, no kept rows


def test_a_preloaded_table_holds_every_id_and_builds_project_nothing(model, monkeypatch):
    """preload (the engine's default on a GPU): every id projected when the table is made, in chunks, into one
    table of vocab rows (no growth); rows equal the per-request projection; a build projects nothing; a weight
    change projects the whole vocabulary again."""
    import voxflow.models.qwen3_tts.text_rows as text_rows
    monkeypatch.setattr(text_rows, "PRELOAD_CHUNK", 40000)         # a few chunks, the last one partial
    tables = []                                                     # the table each chunk was written into
    real_add = ProjectedTextRows._add
    monkeypatch.setattr(ProjectedTextRows, "_add", lambda self, ids: (tables.append(self._table), real_add(self, ids)))
    talker = model.talker
    cache = ProjectedTextRows(talker, preload=True)
    vocab = talker.model.text_embedding.num_embeddings
    assert cache.projected == vocab and cache._table.shape == (vocab, talker.cfg.hidden_size)
    assert len(tables) == -(-vocab // 40000) and all(t is cache._table for t in tables)     # allocated once, first
    assert cache.table_bytes == vocab * talker.cfg.hidden_size * 4
    ids = [0, vocab - 1, 151644, 9707, 40000, 39999]                 # both ends, chunk borders
    assert close(cache.rows(ids), direct(talker, ids))
    assert cache.projected == vocab
    w = talker.text_projection.linear_fc1.bias
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.add_(0.25)
        assert close(cache.rows(ids), direct(talker, ids))
        assert cache.projected == 2 * vocab
    finally:
        with torch.no_grad():
            w.copy_(saved)


def test_warming_projects_the_first_ids_and_leaves_room_for_the_rest(model, monkeypatch):
    """warm (preload_text_ids, for a server without the whole preloaded table): the first N ids projected at once,
    in chunks, equal to the per-request projection; a build of those ids then projects nothing, other ids are
    projected on first sight as before; at most half the kept rows (the rest is room for other ids before a full
    table starts over); the talker's warm_text_rows turns keeping rows on and reports what it made."""
    import voxflow.models.qwen3_tts.text_rows as text_rows
    monkeypatch.setattr(text_rows, "PRELOAD_CHUNK", 48)            # a few chunks, the last one partial
    talker = model.talker
    cache = ProjectedTextRows(talker, max_rows=256)
    assert cache.warm(100) == 100 and cache.projected == 100
    ids = [0, 47, 48, 99, 5, 5]                                     # chunk borders, a repeat
    assert close(cache.rows(ids), direct(talker, ids)) and cache.projected == 100     # all kept: none projected
    other = [100, 9707, 151644]
    assert close(cache.rows(other), direct(talker, other)) and cache.projected == 103
    assert cache.warm(120) == 19                                    # only the ids not kept yet (100 is)
    with pytest.raises(ValueError, match="half"):
        cache.warm(129)
    assert ProjectedTextRows(talker, preload=False, max_rows=4).warm(0) == 0
    keep, rows = talker.keep_text_rows, talker._text_rows
    try:
        talker.keep_text_rows, talker._text_rows = None, None
        made = talker.warm_text_rows(64)
        assert talker.keeps_text_rows() and made["ids"] == 64
        assert made["bytes"] == talker._text_rows._table.numel() * 4 and made["seconds"] >= 0
        assert close(talker.text_rows([3, 63]), direct(talker, [3, 63])) and talker._text_rows.projected == 64
    finally:
        talker.keep_text_rows, talker._text_rows = keep, rows
