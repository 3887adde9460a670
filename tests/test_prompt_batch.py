"""Prompts built together (prompt.build_prompts, prompt_assembly.py) against each request built alone, on the tiny
checkpoints: every field equal, the tensors bit for bit (signed zeros included), for every task and layout, with the
text rows kept per token id (the GPU default) and without (the CPU default's grouped projections), in fp32 and bf16.
A bad request in a batch fails alone with the message it gets alone; a batch is one tokenizer call and one gather
of text rows."""
import os

import pytest
import torch

from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.prompt import PromptError, PromptRequest, build_prompt, build_prompts

TINY = os.environ["VOXFLOW_TINY_DIR"]
TEXTS = ["Hello world.", "x", "A much longer sentence with many words in it, to test every layout properly.",
         "你好，世界。"]
_models: dict = {}


def model(name: str, dtype=torch.float32) -> Qwen3TTS:
    if (name, dtype) not in _models:
        _models[name, dtype] = Qwen3TTS.from_pretrained(os.path.join(TINY, name), dtype=dtype)
    return _models[name, dtype]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (torch.equal would take -0.0 for 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def assert_same_prompt(got, want):
    assert same_bits(got.inputs_embeds, want.inputs_embeds)
    assert same_bits(got.trailing_text, want.trailing_text)
    assert same_bits(got.tts_pad_embed, want.tts_pad_embed)
    for name in ("layout", "text_ids", "instruct_ids", "ref_ids", "codec_ids", "language", "speaker",
                 "instruction_dropped"):
        assert getattr(got, name) == getattr(want, name), name


def mixed_requests(m: Qwen3TTS) -> list[PromptRequest]:
    """Every layout the model's task has: both streaming modes, several languages / speakers (dialect ones too),
    instructions (dropped on the 0.6B CustomVoice), x-vector-only and in-context clones with the text longer and
    shorter than the reference frames."""
    g = torch.Generator().manual_seed(0)
    hidden = m.config.talker.hidden_size
    out = []
    for i, text in enumerate(TEXTS):
        for non_streaming in (None, True, False):
            kw = dict(text=text, non_streaming_mode=non_streaming, language=("auto", "english", "chinese")[i % 3])
            if m.task == "custom_voice":
                kw["speaker"] = ("vivian", "ryan", "eric", "dylan")[i]
                if i % 2:
                    kw["instruction"] = "Speak happily."
            elif m.task == "voice_design":
                kw["instruction"] = "A calm, clear voice." * (i + 1)
            else:
                kw["x_vector"] = torch.randn(hidden, generator=g).to(m.dtype)
                if i % 2 == 0:
                    kw["ref_text"] = "The quick brown fox." * (1 + i)
                    kw["ref_codes"] = torch.randint(0, 2048, ((3, 40)[i % 4 // 2], 16), generator=g)
            out.append(PromptRequest(**kw))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kept_rows", [False, True], ids=["projected", "kept_rows"])
@pytest.mark.parametrize("name", ["custom_voice", "custom_voice_1b7", "voice_design", "base"])
def test_a_mixed_batch_equals_each_request_built_alone(name, kept_rows, dtype):
    m = model(name, dtype)
    m.talker.keep_text_rows = kept_rows
    try:
        requests = mixed_requests(m)
        with torch.no_grad():
            together = build_prompts(m.config, m.tokenizer, m.talker, requests)
            alone = [build_prompt(m.config, m.tokenizer, m.talker, r) for r in requests]
    finally:
        m.talker.keep_text_rows = None
    layouts = {p.layout for p in together}
    assert layouts == ({"streaming", "non_streaming", "icl_streaming", "icl_non_streaming"} if name == "base"
                       else {"streaming", "non_streaming"})
    if name == "base":      # in-context clones with the text outliving the frames (trailing text) and not (tts_pad)
        assert {p.trailing_text.shape[0] > 1 for p in together if p.layout == "icl_streaming"} == {True, False}
    for got, want in zip(together, alone):
        assert_same_prompt(got, want)


def test_bad_requests_fail_alone_with_the_message_they_get_alone():
    m = model("base")
    hidden = m.config.talker.hidden_size
    good = PromptRequest(text="Hello there.", x_vector=torch.ones(hidden))
    bad = [PromptRequest(text="   ", x_vector=torch.ones(hidden)),
           PromptRequest(text="Hi.", x_vector=torch.ones(hidden + 1)),
           PromptRequest(text="Hi.", x_vector=torch.ones(hidden), ref_text="ref",
                         ref_codes=torch.full((3, 16), 4096)),
           PromptRequest(text="Hi.", x_vector=torch.ones(hidden), language="klingon"),
           PromptRequest(text="Hi.", speaker="vivian", x_vector=torch.ones(hidden))]
    requests = [good, bad[0], good, bad[1], bad[2], good, bad[3], bad[4]]
    with torch.no_grad():
        results = build_prompts(m.config, m.tokenizer, m.talker, requests)
        want = build_prompt(m.config, m.tokenizer, m.talker, good)
    for request, result in zip(requests, results):
        if request is good:
            assert_same_prompt(result, want)
            continue
        assert isinstance(result, PromptError)
        with pytest.raises(PromptError) as alone:
            build_prompt(m.config, m.tokenizer, m.talker, request)
        assert str(result) == str(alone.value)


def test_a_plain_value_error_fails_only_its_request():
    """Not only PromptError: torch's own ValueError for a malformed input (a ragged x-vector list), and a tokenizer
    that raises for one text inside the batched encode, fail their request alone, with the message they get alone."""
    m = model("base")
    hidden = m.config.talker.hidden_size
    good = PromptRequest(text="Hello there.", x_vector=torch.ones(hidden))
    ragged = PromptRequest(text="Hi.", x_vector=[[1.0] * hidden, [1.0]])
    picky = PromptRequest(text="Hi, RAISE here.", x_vector=torch.ones(hidden))

    class Picky:
        def __init__(self, inner):
            self.inner = inner

        def encode(self, text):
            if "RAISE" in text:
                raise ValueError("the tokenizer refused this text")
            return self.inner.encode(text)

        def encode_batch(self, texts):
            return [self.encode(t) for t in texts]
    tokenizer = Picky(m.tokenizer)
    requests = [good, ragged, good, picky] + [good] * 6           # >= 8 texts: the batched encode runs
    with torch.no_grad():
        results = build_prompts(m.config, tokenizer, m.talker, requests)
        want = build_prompt(m.config, tokenizer, m.talker, good)
    for i, result in enumerate(results):
        if requests[i] is good:
            assert_same_prompt(result, want)
    for i in (1, 3):
        assert isinstance(results[i], ValueError)
        with pytest.raises(ValueError) as alone:
            build_prompt(m.config, tokenizer, m.talker, requests[i])
        assert str(results[i]) == str(alone.value)


class _OutOfRangeForBad:
    """The tiny tokenizer, but a text with "BAD" in it starts with an id outside the text embedding table (a
    checkpoint whose tokenizer and weights disagree): only the kept-rows gather notices, in the batched part."""

    def __init__(self, inner, bad_id):
        self.inner, self.bad_id = inner, bad_id

    def encode(self, text):
        ids = self.inner.encode(text)
        return ids[:3] + [self.bad_id] + ids[3:] if "BAD" in text else ids       # after the role's 3 ids

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]


def test_an_error_of_the_batched_embedding_fails_only_its_request():
    m = model("custom_voice")
    tokenizer = _OutOfRangeForBad(m.tokenizer, m.talker.model.text_embedding.num_embeddings)
    requests = [PromptRequest(text=t, speaker="vivian") for t in ("Hello there.", "A BAD one.", "And another.")]
    m.talker.keep_text_rows = True
    try:
        with torch.no_grad():
            results = build_prompts(m.config, tokenizer, m.talker, requests)
            alone = [build_prompt(m.config, tokenizer, m.talker, r) for r in (requests[0], requests[2])]
            with pytest.raises(ValueError) as bad_alone:
                build_prompt(m.config, tokenizer, m.talker, requests[1])
    finally:
        m.talker.keep_text_rows = None
    assert isinstance(results[1], ValueError) and "out of range" in str(results[1])
    assert str(results[1]) == str(bad_alone.value)
    assert_same_prompt(results[0], alone[0])
    assert_same_prompt(results[2], alone[1])


class _Counting:
    def __init__(self, inner):
        self.inner, self.calls = inner, {"encode": 0, "encode_batch": 0}

    def encode(self, text):
        self.calls["encode"] += 1
        return self.inner.encode(text)

    def encode_batch(self, texts):
        self.calls["encode_batch"] += 1
        return self.inner.encode_batch(texts)


def test_a_batch_is_one_tokenizer_call_and_one_gather_of_text_rows():
    m = model("custom_voice_1b7")
    talker = m.talker
    tokenizer = _Counting(m.tokenizer)
    rows = talker.text_rows
    gathers = []
    talker.keep_text_rows = True
    talker.text_rows = lambda ids: gathers.append(len(ids)) or rows(ids)
    requests = [PromptRequest(text=t, speaker="vivian", language="english", instruction="Softly.",
                              non_streaming_mode=bool(i % 2)) for i, t in enumerate(TEXTS * 3)]
    try:
        with torch.no_grad():
            build_prompt(m.config, tokenizer, talker, requests[0])     # the fixed rows, made once and kept
            tokenizer.calls.update(encode=0, encode_batch=0)
            gathers.clear()
            results = build_prompts(m.config, tokenizer, talker, requests)
    finally:
        del talker.text_rows
        talker.keep_text_rows = None
    assert tokenizer.calls == {"encode": 0, "encode_batch": 1}
    assert len(gathers) == 1 and gathers[0] == sum(len(p.instruct_ids) + len(p.text_ids) - 8 for p in results)


class _NegativeZeroText:
    """Text rows of -0.0 (codec rows from the ids): a text-only position must keep them bit for bit."""

    def __init__(self, hidden):
        self.hidden = hidden

    def embed_text(self, ids):
        return torch.full((ids.numel(), self.hidden), -0.0)

    def embed_codec(self, ids):
        return torch.sin(ids.reshape(-1, 1).float() + torch.arange(self.hidden))

    def embed_frame(self, codes):
        return self.embed_codec(codes[:, 0])


def test_text_only_positions_keep_the_text_rows_bits():
    m = model("custom_voice_1b7")
    embedder = _NegativeZeroText(m.config.talker.hidden_size)
    requests = [PromptRequest(text=t, speaker="ryan", instruction="Softly.") for t in TEXTS[:2]]
    for p in build_prompts(m.config, m.tokenizer, embedder, requests):
        text_only = len(p.instruct_ids) + 3                           # instruction and role rows
        assert same_bits(p.inputs_embeds[:text_only], torch.full((text_only, embedder.hidden), -0.0))
        assert same_bits(p.trailing_text, torch.full_like(p.trailing_text, -0.0))
