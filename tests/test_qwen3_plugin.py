"""The engine-facing Qwen3-TTS plugin (batched, paged talker) and codec runner, against the eager reference.

A hand-rolled page allocator and a tiny engine loop (below) drive the plugin the way the engine does: attach,
chunked prefill into pages, batched decode of whatever is running, detach. Greedy codes must EQUAL the eager
reference loop's (generate.py) whatever the batch, chunking or preemption; seeded sampling must not depend on
the batch. The KV pools are filled with NaN, so a read of memory that was never written poisons the output.
"""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from voxflow.engine.model_api import PagedKVContext
from voxflow.engine.request import SamplingOptions, SpeechRequest
from voxflow.layers.paged_attention import PagedKVView
from voxflow.models.qwen3_tts import batch_sampling as B
from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
from voxflow.models.qwen3_tts.generate import (SynthesisRequest, decode_to_wav, generate_codes,
                                               make_voice_clone_prompt, prepare)
from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.plugin import Qwen3TTSPlugin
from voxflow.models.qwen3_tts.sampling import RequestSampler

torch.set_num_threads(1)
TINY = os.environ.get("VOXFLOW_TINY_DIR", "")


# ------------------------------------------------------------------------------- a tiny engine for tests
class Pages:
    """Page pool + per-sequence block lists, NaN-filled."""

    def __init__(self, spec, num_blocks=160, block_size=4, device="cpu"):
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.k = [torch.full(shape, float("nan"), dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]
        self.v = [torch.full(shape, float("nan"), dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]
        self.bs, self.device = block_size, device
        self.free = list(range(num_blocks))[::-1]        # handed out in an order unlike the token order
        self.blocks, self.lens = {}, {}

    def context(self, sids, n) -> PagedKVContext:
        slots = []
        for s in sids:
            blocks, start = self.blocks.setdefault(s, []), self.lens.get(s, 0)
            while len(blocks) * self.bs < start + n:
                blocks.append(self.free.pop(len(self.free) // 2))
            self.lens[s] = start + n
            slots.append([blocks[t // self.bs] * self.bs + t % self.bs for t in range(start, start + n)])
        width = max(len(self.blocks[s]) for s in sids) + 1                # one spare column: T > every length
        tables = [self.blocks[s] + [-1] * (width - len(self.blocks[s])) for s in sids]
        as_tensor = (lambda x: torch.tensor(x, device=self.device))
        return PagedKVContext(self.k, self.v, self.bs, as_tensor(tables), as_tensor([self.lens[s] for s in sids]),
                              as_tensor(slots))

    def release(self, sid):
        self.free += self.blocks.pop(sid, [])
        self.lens.pop(sid, None)


class MiniEngine:
    """late=True: the finished flags are acted on one decode later (the extra frame is discarded)."""

    def __init__(self, plugin, chunk=None, late=False):
        self.p, self.chunk, self.late = plugin, chunk, late
        self.pages = Pages(plugin.kv_spec, device=plugin.device)
        self.active, self.frames, self.eos, self.prepared, self.finishing = {}, {}, {}, {}, set()

    def _prefill(self, slot, rid, embeds):
        n = embeds.shape[0]
        chunk = self.chunk or n
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            self.p.prefill(slot, embeds[a:b], a, self.pages.context([rid], b - a), last=(b == n))

    def _slot_of(self, rid):
        return next(s for s, r in self.active.items() if r == rid)

    def add(self, rid, prepared, slot=None):
        slot = next(s for s in range(self.p.max_slots) if s not in self.active) if slot is None else slot
        self.prepared[rid] = prepared
        self.p.attach(slot, prepared)
        self.active[slot] = rid
        self.frames.setdefault(rid, [])
        self._prefill(slot, rid, prepared.prompt_embeds)

    def preempt(self, rid, new_slot=None, keep_slot=False):
        """Drop the request's pages; re-prefill prompt + fed-back frames (into a new slot unless keep_slot)."""
        slot = self._slot_of(rid)
        self.pages.release(rid)
        if not keep_slot:
            self.p.detach(slot)
            del self.active[slot]
            slot = next(s for s in range(self.p.max_slots) if s not in self.active) if new_slot is None else new_slot
            self.p.attach(slot, self.prepared[rid])
            self.active[slot] = rid
        embeds = self.p.resume_embeds(slot)
        assert embeds.shape[0] == self.prepared[rid].prompt_len + len(self.frames[rid])
        # given the count the engine knows, the same rows without reading it back from the slot
        assert torch.equal(self.p.resume_embeds(slot, len(self.frames[rid])), embeds)
        self._prefill(slot, rid, embeds)

    def step(self):
        slots = sorted(self.active)
        rids = [self.active[s] for s in slots]
        out = self.p.decode(torch.tensor(slots, device=self.p.device), self.pages.context(rids, 1))
        for i, (slot, rid) in enumerate(zip(slots, rids)):
            if rid in self.finishing:
                self._finish(slot, rid)
                continue
            self.frames[rid].append(out.frames[i].clone())
            if bool(out.finished[i]):
                self.eos[rid] = bool(out.eos[i])
                if self.late:
                    self.finishing.add(rid)
                else:
                    self._finish(slot, rid)

    def _finish(self, slot, rid):
        self.p.detach(slot)
        del self.active[slot]
        self.pages.release(rid)
        self.finishing.discard(rid)

    def run(self, requests, joins, events=None, max_steps=200):
        """joins: step -> request ids to add before that step; events: step -> callable(engine)."""
        for step in range(max_steps):
            for rid in joins.get(step, []):
                self.add(rid, self.p.prepare(requests[rid]))
            if step in (events or {}):
                events[step](self)
            if not self.active and step >= max(joins):
                break
            if self.active:
                self.step()
        return self

    def codes(self, rid):
        return torch.stack(self.frames[rid]).cpu() if self.frames[rid] else torch.zeros(0, 16, dtype=torch.long)


# -------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cv():
    return Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"))


@pytest.fixture(scope="module")
def base():
    return Qwen3TTS.from_pretrained(os.path.join(TINY, "base"))


def speech(text, n, streaming=False, voice="ryan", **sampling):
    sampling.setdefault("greedy", True)
    return SpeechRequest(text=text, voice=voice, non_streaming_mode=not streaming,
                         sampling=SamplingOptions(max_new_tokens=n, **sampling))


def reference_codes(model, req: SpeechRequest, **extra) -> tuple[torch.Tensor, str]:
    """The eager loop (generate.synthesize without the waveform) on the same request."""
    r = SynthesisRequest(text=req.text, speaker=req.voice if model.task != "base" else None,
                         non_streaming_mode=req.non_streaming_mode, greedy=True,
                         max_new_tokens=req.sampling.max_new_tokens, **extra)
    prompt, params, n, _ = prepare(model, r)
    codes, finish, _, _ = generate_codes(model, prompt, RequestSampler(params, device=model.device), n)
    return codes.cpu(), finish


# Prompt lengths 13 / 9 (streaming, trailing text outlives the frames) / 9 (trailing text runs out) / 25.
GREEDY = [speech("Hello world.", 10), speech("A much longer sentence with many words in it to test.", 12, True),
          speech("Short one", 9, True), speech("Another sentence of a medium length here.", 8)]


@pytest.fixture(scope="module")
def greedy_refs(cv):
    return [reference_codes(cv, r)[0] for r in GREEDY]


# ----------------------------------------------------------------------------------- paged attention
def test_paged_view_writes_pages_and_gathers_right_aligned():
    torch.manual_seed(0)
    spec = type("S", (), dict(num_layers=1, num_kv_heads=2, head_dim=3, dtype=torch.float32))
    pages = Pages(spec, num_blocks=8, block_size=2)
    k0, v0 = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)        # seq "a": 3 tokens
    k1, v1 = torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3)        # seq "b": 1 token
    for sid, k, v in (("a", k0, v0), ("b", k1, v1)):
        view = PagedKVView(pages.context([sid], k.shape[2]), k.shape[2])
        view[0].append(k, v)
    kn, vn = torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3)         # one decode token each
    view = PagedKVView(pages.context(["a", "b"], 1), 1)
    keys, values = view[0].append(kn, vn)
    t = view.num_keys
    assert view.seq_len == t - 1 and keys.shape == (2, 2, t, 3)
    assert view.key_valid.tolist() == [[False] * (t - 4) + [True] * 4, [False] * (t - 2) + [True] * 2]
    torch.testing.assert_close(keys[0, :, -4:], torch.cat((k0[0], kn[0]), dim=1), rtol=0, atol=0)
    torch.testing.assert_close(values[1, :, -2:], torch.cat((v1[0], vn[1]), dim=1), rtol=0, atol=0)
    assert not keys.isnan().any() and not values.isnan().any()        # padding never reads unwritten pages


# ------------------------------------------------------------------------------ counter-based sampling
def test_hash_matches_host_version_and_noise_is_uniform_and_keyed():
    x = torch.tensor([0, 1, 12345, 0xFFFFFFFF, 0x80000000])
    assert B.hash32(x).tolist() == [B.hash32_int(int(v)) for v in x]
    keys = torch.tensor([B.seed_key(s) for s in range(2000)])
    u = B.uniform_noise(keys, torch.zeros(2000, dtype=torch.long), 0, 64)
    assert 0 < float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    again = B.uniform_noise(keys[:3], torch.zeros(3, dtype=torch.long), 0, 64)
    assert torch.equal(again, u[:3])                                  # a pure function of its counters
    other_cb = B.uniform_noise(keys[:3], torch.zeros(3, dtype=torch.long), 1, 64)
    other_frame = B.uniform_noise(keys[:3], torch.ones(3, dtype=torch.long), 0, 64)
    assert not torch.equal(other_cb, u[:3]) and not torch.equal(other_frame, u[:3])


def test_gumbel_draws_follow_the_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    n = 6000
    logits = probs.log().expand(n, -1)
    keys = torch.tensor([B.seed_key(s) for s in range(n)])
    ids = B.gumbel_argmax(logits, keys, torch.full((n,), 7), 3)
    freq = torch.bincount(ids, minlength=5).float() / n
    assert (freq - probs).abs().max() < 0.025 and freq[4] == 0


# ------------------------------------------------------------------------------- the batched talker
@pytest.mark.parametrize("chunk,late", [(None, True), (5, False)])
def test_greedy_batch_with_joins_and_leaves_equals_reference(cv, greedy_refs, chunk, late):
    eng = MiniEngine(Qwen3TTSPlugin(cv, max_slots=4), chunk=chunk, late=late)
    eng.run(GREEDY, joins={0: [0, 1], 2: [2], 5: [3]})
    for rid, ref in enumerate(greedy_refs):
        assert ref.shape[0] == GREEDY[rid].sampling.max_new_tokens - 1
        assert torch.equal(eng.codes(rid), ref), rid
        assert eng.eos[rid] is False                                  # stopped by the frame limit
    assert not eng.active and all(p is None for p in eng.p._attached)


SAMPLED = speech("A sentence that is sampled with a seed.", 10, True, greedy=False, seed=1234)


@pytest.fixture(scope="module")
def sampled_alone(cv):
    return MiniEngine(Qwen3TTSPlugin(cv, max_slots=4)).run({0: SAMPLED}, joins={0: [0]}).codes(0)


def test_seeded_sampling_is_reproducible_and_batch_independent(cv, sampled_alone):
    others = {1: speech("Hello world.", 8, greedy=False, seed=5), 2: GREEDY[0],
              3: speech("Hello world.", 8, greedy=False, seed=6, temperature=1.3, top_k=0, top_p=0.8)}
    eng = MiniEngine(Qwen3TTSPlugin(cv, max_slots=4), chunk=7)
    eng.run({0: SAMPLED, **others}, joins={0: [1, 2], 2: [0], 3: [3]})
    assert torch.equal(eng.codes(0), sampled_alone)
    assert sampled_alone.shape == (9, 16)
    assert not torch.equal(eng.codes(1), eng.codes(3))               # other seeds / settings, other codes
    greedy_codes, _ = reference_codes(cv, GREEDY[0])
    assert not torch.equal(sampled_alone[:3], reference_codes(cv, SAMPLED)[0][:3])   # really sampled
    assert torch.equal(eng.codes(2), greedy_codes[:9])               # a greedy row among sampled ones


@pytest.mark.parametrize("keep_slot", [False, True])
def test_preempt_and_resume_continues_with_the_same_codes(cv, greedy_refs, sampled_alone, keep_slot):
    requests = {0: GREEDY[1], 1: SAMPLED, 2: GREEDY[2]}
    events = {3: lambda e: e.preempt(0, new_slot=3, keep_slot=keep_slot),
              5: lambda e: e.preempt(1, keep_slot=keep_slot)}
    eng = MiniEngine(Qwen3TTSPlugin(cv, max_slots=4), chunk=6)
    eng.run(requests, joins={0: [0, 1], 1: [2]}, events=events)
    assert torch.equal(eng.codes(0), greedy_refs[1])
    assert torch.equal(eng.codes(1), sampled_alone)
    assert torch.equal(eng.codes(2), greedy_refs[2])


def test_eos_and_ignore_eos(cv):
    # Make EOS win the (greedy) argmax as soon as the min-length rule allows: a reference that ends on EOS.
    model = copy.deepcopy(cv)
    head = model.talker.codec_head.weight
    head[model.config.talker.codec_eos_token_id] = head[:2048].mean(0) + 50 * model.talker.model.norm.weight
    req = speech("Hello world.", 20)
    ref, finish = reference_codes(model, req)
    assert finish == "eos" and 0 < ref.shape[0] < 19
    plugin = Qwen3TTSPlugin(model, max_slots=2)
    eng = MiniEngine(plugin).run({0: req, 1: speech("Hello world.", 6, ignore_eos=True)}, joins={0: [0, 1]})
    assert torch.equal(eng.codes(0), ref) and eng.eos[0] is True
    assert eng.codes(1).shape[0] == 5 and eng.eos[1] is False and (eng.codes(1)[:, 0] < 2048).all()


# ------------------------------------------------------------------------------------ voice clone
REF_TEXT = "This is the reference."


def ref_clip(seconds=0.6, sr=24000):
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def test_voice_clone_icl_request_equals_reference(base):
    audio = ref_clip()
    req = SpeechRequest(text="Clone this voice please.", task="voice_clone", ref_audio=audio.tobytes(),
                        ref_text=REF_TEXT, sampling=SamplingOptions(greedy=True, max_new_tokens=8))
    plugin = Qwen3TTSPlugin(base, max_slots=2)
    prepared = plugin.prepare(req)
    clone = make_voice_clone_prompt(base, audio, REF_TEXT)
    assert prepared.info["layout"] == "icl_streaming"
    assert torch.equal(prepared.codec_prefix_frames, clone.ref_codes)
    assert len(prepared.position_keys) == prepared.prompt_len
    ref, _ = reference_codes(base, SpeechRequest(text=req.text, sampling=req.sampling), voice_clone_prompt=clone)
    eng = MiniEngine(plugin, chunk=5).run({0: req}, joins={0: [0]})
    assert torch.equal(eng.codes(0), ref)


# --------------------------------------------------------------------------------- request mapping
def test_prepare_maps_and_validates_requests(cv, base):
    plugin = Qwen3TTSPlugin(cv, max_slots=1)
    p = plugin.prepare(SpeechRequest(text="Hi there.", voice="Vivian", sampling=SamplingOptions(max_new_tokens=7)))
    assert p.max_frames == 6 and p.info["speaker"] == "vivian" and p.state.params.do_sample
    assert plugin.prepare(SpeechRequest(text="Hi there.", voice="ryan")).max_frames == cv.generation.max_new_tokens - 1
    for bad in (SpeechRequest(text="Hi.", voice="nobody"), SpeechRequest(text="Hi.", voice="ryan", task="voice_clone"),
                SpeechRequest(text="Hi.", voice="ryan", task="dance"), SpeechRequest(text="  ", voice="ryan"),
                SpeechRequest(text="Hi.", voice="ryan", ref_audio=ref_clip().tobytes()),
                SpeechRequest(text="Hi.", voice="ryan", sampling=SamplingOptions(temperature=0.0))):
        with pytest.raises(ValueError):
            plugin.prepare(bad)
    clone = Qwen3TTSPlugin(base, max_slots=1)
    for bad in (SpeechRequest(text="Hi."), SpeechRequest(text="Hi.", ref_audio=b"abc"),
                SpeechRequest(text="Hi.", ref_audio=ref_clip().tobytes())):        # ICL without ref_text
        with pytest.raises(ValueError):
            clone.prepare(bad)
    xvec = clone.prepare(SpeechRequest(text="Hi.", ref_audio=ref_clip().tobytes(), x_vector_only=True))
    assert xvec.codec_prefix_frames is None and len(xvec.position_keys) == xvec.prompt_len


def test_equal_position_keys_mean_equal_embeddings(cv, base):
    plugin = Qwen3TTSPlugin(cv, max_slots=1)
    reqs = [speech("Hello world.", 5), speech("Hello world.", 5, voice="vivian"), speech("Hello there.", 5),
            speech("Hello world.", 5, True), speech("Hello world. Again.", 5, True)]
    clone = Qwen3TTSPlugin(base, max_slots=1)
    audio = ref_clip().tobytes()
    preps = [plugin.prepare(r) for r in reqs] + [
        clone.prepare(SpeechRequest(text=t, ref_audio=audio, ref_text=REF_TEXT, non_streaming_mode=ns))
        for t, ns in (("Hello world.", False), ("Hello world.", True), ("Hi.", False))]
    seen: dict[int, torch.Tensor] = {}
    for p in preps:
        assert len(p.position_keys) == p.prompt_len
        for key, row in zip(p.position_keys, p.prompt_embeds):
            assert 0 <= key < 2 ** 63
            if key in seen:
                assert torch.equal(seen[key], row)
            seen[key] = row
    a, b, c = (p.position_keys for p in preps[:3])
    assert a == plugin.prepare(reqs[0]).position_keys
    # a voice prompt's keys need the voice's own key (else two voices would share cached prompts)
    from voxflow.models.qwen3_tts.position_keys import position_keys
    prompt = prepare(base, SynthesisRequest(text="Hi.", ref_audio=ref_clip(), ref_text=REF_TEXT))[0]
    with pytest.raises(ValueError, match="voice_key"):
        position_keys(prompt, None, 3)
    first_diff = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert a[:first_diff] == b[:first_diff] and first_diff >= 3      # same role, then the speaker differs
    assert a[-2:] == c[-2:] and a != c                               # same tail (eos, bos) after other text



def _keys_position_by_position(prompt, voice_key, num_ref_frames):
    """The keys as position_keys.py's docstring defines them, one (text part, codec part) a position in
    build_prompt's block order: the plain form the batched code must equal."""
    import hashlib

    from voxflow.models.qwen3_tts import position_keys as pk
    from voxflow.models.qwen3_tts.prompt import REF_TAIL_LEN, ROLE_LEN, TEXT_TAIL_LEN
    m = 2 ** 64

    def mix(x):
        x ^= x >> 30
        x = x * 0xBF58476D1CE4E5B9 % m
        x ^= x >> 27
        x = x * 0x94D049BB133111EB % m
        return x ^ (x >> 31)

    def text(ids):
        group = int.from_bytes(hashlib.blake2b(np.asarray(ids, dtype=np.uint64).tobytes(), digest_size=8,
                                               person=b"text ids").digest(), "little") >> 1
        return [mix(group ^ (i * 0x9E3779B97F4A7C15 % m)) for i in ids]

    part = pk.content_key
    bos, eos, pad = (part(("S", n)) for n in ("bos", "eos", "pad"))
    codec = prompt.codec_ids
    c_pad, c_bos = part(("C", codec[-2])), part(("C", codec[-1]))
    prefix = [part(("C", c)) if c is not None else part(("X", voice_key)) for c in codec[:-1]]
    rows = [(t, pk._NONE) for t in (text(prompt.instruct_ids) if prompt.instruct_ids else [])]
    rows += [(t, pk._NONE) for t in text(prompt.text_ids[:ROLE_LEN])]
    rows += [(pad, c) for c in prefix[:-1]] + [(bos, prefix[-1])]
    body = prompt.text_ids[ROLE_LEN:-TEXT_TAIL_LEN]
    if prompt.layout == "non_streaming":
        rows += [(t, c_pad) for t in text(body) + [eos]] + [(pad, c_bos)]
    elif prompt.layout == "streaming":
        rows += [(text(body[:1])[0], c_bos)]
    else:
        text_seq = text(prompt.ref_ids[ROLE_LEN:-REF_TAIL_LEN] + body) + [eos]
        frame = part(("F", voice_key))
        codec_seq = [c_bos] + [mix(frame ^ (i * 0x9E3779B97F4A7C15 % m)) for i in range(num_ref_frames)]
        if prompt.layout == "icl_non_streaming":
            rows += [(t, c_pad) for t in text_seq] + [(pad, c) for c in codec_seq]
        else:
            rows += list(zip((text_seq + [pad] * len(codec_seq))[:len(codec_seq)], codec_seq))
    return [mix(mix(t) * 0x9E3779B97F4A7C15 % m ^ c) >> 1 for t, c in rows]


def test_position_keys_of_a_burst_equal_each_alone(cv, base):
    """position_keys_many (the plugin's burst path) gives each prompt the keys it gets alone, in every layout, and a
    prompt that cannot be keyed fails alone (the others keep theirs)."""
    from voxflow.models.qwen3_tts.position_keys import position_keys, position_keys_many
    audio = ref_clip()
    clone = make_voice_clone_prompt(base, audio, REF_TEXT, False)
    xvec = make_voice_clone_prompt(base, audio, None, True)
    items = []
    for text, ns in (("Hello world.", True), ("Hi.", False), ("Hello there, again and again.", True)):
        items.append((prepare(cv, SynthesisRequest(text=text, speaker="vivian", non_streaming_mode=ns))[0], None, 0))
        for voice in (clone, xvec):
            req = SynthesisRequest(text=text, voice_clone_prompt=voice, non_streaming_mode=ns)
            frames = voice.ref_codes.shape[0] if voice.ref_codes is not None else 0
            items.append((prepare(base, req)[0], voice.key, frames))
    assert {p.layout for p, _, _ in items} == {"non_streaming", "streaming", "icl_non_streaming", "icl_streaming"}
    bad = (items[1][0], None, 0)                        # a voice prompt without its voice's key
    got = position_keys_many(items[:3] + [bad] + items[3:])
    assert isinstance(got[3], ValueError) and "voice_key" in str(got[3])
    want = [position_keys(*item) for item in items]
    assert got[:3] + got[4:] == want
    assert want == [_keys_position_by_position(*item) for item in items]
    assert all(len(k) == p.length for k, (p, _, _) in zip(want, items))
    assert len({tuple(k) for k in want}) == len(want)   # distinct prompts, distinct key lists


# ------------------------------------------------------------------------------------------ codec
def test_codec_runner_chunks_equal_decode_to_wav(cv, greedy_refs):
    runner = Qwen3CodecRunner(cv)
    a, b = greedy_refs[0], greedy_refs[1]                             # 9 and 11 frames
    states = [runner.new_state(None), runner.new_state(None)]
    pcm = [[], []]
    # Both requests feed 4 frames in the first call (one batched decode), then different schedules.
    for cuts in (((0, 4), (0, 4)), ((4, 5), (4, 10)), ((5, 9), (10, 11))):
        out, states = runner.decode(states, [a[slice(*cuts[0])], b[slice(*cuts[1])]])
        for i in range(2):
            pcm[i].append(out[i])
    for i, codes in enumerate((a, b)):
        got = np.concatenate(pcm[i])
        want = decode_to_wav(cv, codes)
        assert got.dtype == np.float32 and got.shape == want.shape == (codes.shape[0] * 1920,)
        assert np.abs(got - want).max() <= 1e-5


def test_codec_runner_icl_prefix_is_consumed_silently(base):
    runner = Qwen3CodecRunner(base)
    ref_codes = make_voice_clone_prompt(base, ref_clip(), REF_TEXT).ref_codes
    codes = torch.randint(0, 2048, (7, 16), generator=torch.Generator().manual_seed(3))
    state = runner.new_state(ref_codes)
    pcm = []
    for a, b in ((0, 2), (2, 7)):
        out, [state] = runner.decode([state], [codes[a:b]])
        pcm.append(out[0])
    got = np.concatenate(pcm)
    want = decode_to_wav(base, codes, ref_codes)
    # The official proportional cut may keep one extra leading sample (generate.decode_to_wav).
    assert got.shape[0] == 7 * 1920 and want.shape[0] - got.shape[0] in (0, 1)
    assert np.abs(got - want[-got.shape[0]:]).max() <= 1e-5


def test_decode_variant_tracks_the_attached_requests_warp_settings(cv):
    """The graph variant (which sampling work can be skipped exactly) follows attach / detach."""
    plugin = Qwen3TTSPlugin(cv, max_slots=4)
    assert plugin.decode_variant() == (False, False, (None, False), (None, False))
    a = plugin.prepare(speech("Hello.", 5, greedy=False, top_k=50))
    b = plugin.prepare(speech("Hello.", 5, greedy=False, top_k=7, top_p=0.8))
    plugin.attach(0, a)
    assert plugin.decode_variant()[:3] == (True, True, (64, False))
    plugin.attach(1, b)
    assert plugin.decode_variant()[2] == (64, True)
    plugin.detach(0)
    assert plugin.decode_variant()[2] == (8, True)            # 7 -> the next power of two
    plugin.detach(1)
    assert plugin.decode_variant() == (False, False, (None, False), (None, False))
    off = plugin.prepare(speech("Hello.", 5, greedy=False, top_k=0))
    plugin.attach(2, off)
    assert plugin.decode_variant()[2] == (None, False)         # top-k disabled somewhere: full sort


def test_startup_variants_are_the_default_sampling_one_and_greedy(cv):
    plugin = Qwen3TTSPlugin(cv, max_slots=2)
    default, greedy = plugin.startup_variants()
    assert greedy == (False, False, (None, False), (None, False))
    req = plugin.prepare(speech("Hello.", 5, greedy=False))          # the model's default sampling settings
    plugin.attach(0, req)
    assert plugin.decode_variant() == default
    plugin.detach(0)
    assert plugin.decode_variant() == greedy                        # startup_variants left no trace
    plugin.force_variant(default)
    assert plugin.decode_variant() == default
    plugin.force_variant(None)
    assert plugin.decode_variant() == greedy
