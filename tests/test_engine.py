"""The batched engine (scheduler + paged talker + streaming codec) against the eager single-request reference.

Every test drives a real EngineCore on a tiny checkpoint: requests join and leave at different steps, KV pages
are shared, prefixes cached, memory runs out; the codes (captured where the engine hands frames to the codec)
and the audio must still equal what the eager loop of generate.py produces for each request alone.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.errors import QueueFullError
from voxflow.engine.offline import run_offline
from voxflow.engine.request import (AudioChunk, FinalRecord, FinishReason, SamplingOptions, SpeechRequest,
                                   StreamingOptions)
from voxflow.models.qwen3_tts.generate import SynthesisRequest, decode_to_wav, generate_codes, prepare
from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.sampling import RequestSampler

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
AUDIO_ATOL = 1e-5
_refs: dict[str, Qwen3TTS] = {}


def reference_model(name: str) -> Qwen3TTS:
    if name not in _refs:
        _refs[name] = Qwen3TTS.from_pretrained(os.path.join(TINY, name))
    return _refs[name]


def make_engine(name: str = "custom_voice", **kw) -> EngineCore:
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=96, prefill_chunk_size=None, block_size=4, num_kv_blocks=256)
    cfg.update(kw)
    core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, name), **cfg))
    core.recorded = {}                                   # request id -> frames handed to the codec

    push_rows = core.codec_exec.push_rows

    def recording_push_rows(frames, request_ids):
        for i, rid in enumerate(request_ids):
            if rid is not None:
                core.recorded.setdefault(rid, []).append(frames[i:i + 1].clone())
        push_rows(frames, request_ids)
    core.codec_exec.push_rows = recording_push_rows
    return core


def codes_of(core, rid) -> torch.Tensor:
    return torch.cat(core.recorded[rid]) if rid in core.recorded else torch.zeros(0, 16, dtype=torch.long)


def reference(name: str, req: SpeechRequest):
    """Eager single-request greedy codes and waveform for an engine request."""
    model = reference_model(name)
    s = req.sampling
    sreq = SynthesisRequest(text=req.text, speaker=req.voice, instruct=req.instructions, language=req.language,
                            non_streaming_mode=req.non_streaming_mode, greedy=True, max_new_tokens=s.max_new_tokens,
                            ref_text=req.ref_text, x_vector_only=req.x_vector_only,
                            ref_audio=None if req.ref_audio is None else np.frombuffer(req.ref_audio, "<f4"))
    prompt, params, max_new, clone = prepare(model, sreq)
    codes, finish, _, _ = generate_codes(model, prompt, RequestSampler(params), max_new)
    return codes, finish, decode_to_wav(model, codes, clone.ref_codes if clone is not None else None)


def drive(core, schedule: dict[int, list[SpeechRequest]]):
    """Add requests at the given step numbers and step until all are done; outputs per request."""
    results: dict[str, list] = {}
    step = 0
    while core.has_work() or any(k >= step for k in schedule):
        for req in schedule.get(step, []):
            core.add_request(req)
            results[req.request_id] = []
        for out in core.step():
            results.setdefault(out.request_id, []).append(out)
        core.block_manager.check_invariants()
        step += 1
    return results


def audio_of(outputs) -> np.ndarray:
    chunks = [o for o in outputs if isinstance(o, AudioChunk)]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    return np.concatenate([np.frombuffer(c.pcm, "<f4") for c in chunks]) if chunks else np.zeros(0, np.float32)


def greedy(text, max_new_tokens, **kw) -> SpeechRequest:
    streaming = kw.pop("streaming", StreamingOptions(initial_chunk_frames=2, chunk_frames=5))
    return SpeechRequest(text=text, sampling=SamplingOptions(greedy=True, max_new_tokens=max_new_tokens),
                         streaming=streaming, **kw)


def assert_engine_matches_reference(name, core, results, reqs):
    for req in reqs:
        ref_codes, ref_finish, ref_wav = reference(name, req)
        final = results[req.request_id][-1]
        assert final.reason.value == ref_finish, req.request_id
        assert torch.equal(codes_of(core, req.request_id), ref_codes), f"codes differ for {req.request_id}"
        wav = audio_of(results[req.request_id])
        assert wav.shape == ref_wav.shape
        assert np.abs(wav - ref_wav).max() <= AUDIO_ATOL


def assert_all_released(core):
    core.block_manager.check_invariants()
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
    assert not core.codec_exec.streams and not core.live
    assert core.scheduler.num_running == 0 and core.scheduler.num_waiting == 0


def test_batched_greedy_equals_single_request_with_joins_and_leaves():
    name = "custom_voice_1b7"          # honours instructions: more prompt shapes in one batch
    core = make_engine(name)
    reqs = [greedy("Hello world.", 14, voice="vivian", request_id="a"),
            greedy("The quick brown fox jumps over the lazy dog.", 22, voice="ryan", language="english",
                   non_streaming_mode=False, request_id="b"),
            greedy("Speak.", 9, voice="eric", language="auto", request_id="c"),
            greedy("This is a tiny test.", 17, voice="serena", instructions="Speak happily.", request_id="d"),
            greedy("你好，世界。", 12, voice="dylan", language="chinese", request_id="e")]
    batches = []
    prefill_batch = core.model.prefill_batch
    core.model.prefill_batch = lambda chunks, kv: (batches.append(len(chunks)), prefill_batch(chunks, kv))
    results = drive(core, {0: reqs[:2], 3: reqs[2:4], 7: reqs[4:]})
    assert batches and max(batches) >= 2          # prompts of different lengths shared one padded forward
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)


def test_batched_voice_clone_mix_equals_reference():
    name = "base"
    t = np.arange(24000) / 24000
    ref = (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype("<f4").tobytes()
    core = make_engine(name)
    reqs = [greedy("Hello world.", 12, ref_audio=ref, ref_text="The quick brown fox.", request_id="icl"),
            greedy("This is a test.", 15, ref_audio=ref, x_vector_only=True, request_id="xvec"),
            greedy("Hello world. This is a tiny test.", 10, ref_audio=ref, ref_text="The quick brown fox.",
                   non_streaming_mode=True, request_id="icl-ns")]
    results = drive(core, {0: reqs[:1], 2: reqs[1:]})
    for req in reqs:   # ICL: the engine drops exactly R*1920 samples; the official cut can be one sample short
        ref_codes, ref_finish, ref_wav = reference(name, req)
        assert torch.equal(codes_of(core, req.request_id), ref_codes)
        wav = audio_of(results[req.request_id])
        n = min(len(wav), len(ref_wav))
        assert abs(len(wav) - len(ref_wav)) <= 1
        assert np.abs(wav[-n:] - ref_wav[-n:]).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_seeded_sampling_does_not_depend_on_the_batch():
    def sampled(rid, seed, text="Hello world."):
        return SpeechRequest(text=text, voice="vivian", request_id=rid,
                             sampling=SamplingOptions(seed=seed, max_new_tokens=12))
    solo, crowd = make_engine(), make_engine()
    alone = drive(solo, {0: [sampled("x", 7)]})
    busy = drive(crowd, {0: [sampled("o1", 1, "The quick brown fox.")],
                         1: [sampled("x", 7), sampled("o2", 2, "Speak happily.")]})
    assert torch.equal(codes_of(solo, "x"), codes_of(crowd, "x"))
    # the codec batches "x" with other streams, so only float rounding may differ
    a, b = audio_of(alone["x"]), audio_of(busy["x"])
    assert a.shape == b.shape and np.abs(a - b).max() <= AUDIO_ATOL
    reseeded = make_engine()
    drive(reseeded, {0: [sampled("x", 8)]})
    assert not torch.equal(codes_of(solo, "x"), codes_of(reseeded, "x"))           # the seed matters


@pytest.mark.parametrize("initial, chunk", [(1, 25), (2, 5), (7, 7), (3, 1)])
def test_streamed_audio_equals_one_pass_and_chunks_follow_the_policy(initial, chunk):
    # the regular policy: tail chunks (codec_tail_chunk, 10 by default) off here; the tail-chunk test holds them
    core = make_engine(codec_tail_chunk=0)
    frames = 23                                                  # max_new_tokens 24 -> 23 frames
    streamed = greedy("Hello world.", frames + 1, voice="aiden", request_id="s",
                      streaming=StreamingOptions(initial_chunk_frames=initial, chunk_frames=chunk))
    whole = greedy("Hello world.", frames + 1, voice="aiden", request_id="w", streaming=StreamingOptions(stream=False))
    results = drive(core, {0: [streamed, whole]})
    sizes = [o.num_frames for o in results["s"] if isinstance(o, AudioChunk)]
    expected = [initial] + [chunk] * ((frames - initial) // chunk)
    if sum(expected) < frames:
        expected.append(frames - sum(expected))                 # final partial chunk
    assert sizes == expected
    assert [o.num_frames for o in results["w"] if isinstance(o, AudioChunk)] == [frames]   # one pass
    a, w = audio_of(results["s"]), audio_of(results["w"])
    assert a.shape == w.shape == (frames * 1920,)
    assert np.abs(a - w).max() <= AUDIO_ATOL
    _, _, ref_wav = reference("custom_voice", streamed)
    assert np.abs(a - ref_wav).max() <= AUDIO_ATOL


def test_abort_mid_stream_frees_blocks_slot_and_codec_state():
    core = make_engine()
    reqs = [greedy(t, 30, voice=v, request_id=f"r{i}") for i, (t, v) in
            enumerate([("Hello world.", "vivian"), ("The quick brown fox.", "ryan"), ("Speak happily.", "aiden")])]
    for r in reqs:
        core.add_request(r)
    outputs = {r.request_id: [] for r in reqs}
    for _ in range(6):
        for o in core.step():
            outputs[o.request_id].append(o)
    assert any(isinstance(o, AudioChunk) for o in outputs["r1"])          # mid-stream
    table = core.scheduler.get("r1").block_table
    held = sum(core.block_manager.blocks[b].ref_count == 1 for b in table)   # the first block is shared
    assert 0 < held < len(table)
    free_before = core.block_manager.num_free_blocks
    [final] = core.abort("r1")
    assert final.reason is FinishReason.ABORTED
    assert core.block_manager.num_free_blocks == free_before + held
    assert "r1" not in core.codec_exec.streams and "r1" not in core.live
    core.block_manager.check_invariants()
    while core.has_work():
        for o in core.step():
            outputs[o.request_id].append(o)
    assert all(outputs[r][-1].reason is FinishReason.LENGTH for r in ("r0", "r2"))
    assert core.abort("r0") == []                                        # unknown / finished: nothing
    assert_all_released(core)


@pytest.mark.parametrize("kw", [{}, dict(preload_text_rows=False, preload_text_ids=64), dict(preload_text_rows=False)],
                         ids=["rows", "ids", "ids-default"])
def test_a_cpu_engine_preloads_no_text_rows(kw, monkeypatch):
    """EngineConfig.preload_text_rows (on by default), and preload_text_ids without it (16,384 by default), act on a
    GPU only: a CPU engine builds its prompts with the official code's grouped projection (bit-identical prompts),
    keeps no rows and records no preload; the loader is handed the setting either way."""
    from voxflow.models.qwen3_tts import engine_loader
    seen = []
    load = engine_loader.load
    monkeypatch.setattr(engine_loader, "load", lambda *a, **o: (seen.append(o), load(*a, **o))[1])
    core = make_engine(**kw)
    assert core.config.preload_text_rows == (not kw)
    assert seen and seen[0].get("preload_text_rows", False) == (not kw)
    assert seen[0].get("preload_text_ids", 0) == (kw.get("preload_text_ids", 16384) if kw else 0)
    assert core.model.talker._text_rows is None and "preloaded_text_rows" not in core.startup


@pytest.mark.parametrize("graphs", [False, True, "packed"], ids=["eager", "prefill-runner", "packed"])
def test_prefix_cache_reuses_voice_clone_prompt_blocks(graphs):
    """A prompt whose prefix is cached computes only the rest into its pages and gives the reference's codes: on
    the model's eager path, and through the prefill runner (the new positions as the graph's queries, the cached
    ones read from the pages through the block table), padded or packed."""
    t = np.arange(24000) / 24000
    ref = (0.2 * np.sin(2 * np.pi * 150 * t)).astype("<f4").tobytes()
    core = make_engine("base", block_size=4, prefill_graphs=bool(graphs), packed_prefill=graphs == "packed")
    runs = []
    if graphs:
        run = core.prefill_runner.run
        core.prefill_runner.run = lambda key, items: (runs.append((key, items)), run(key, items))
    first = greedy("Hello world.", 8, ref_audio=ref, ref_text="The quick brown fox.", request_id="first")
    again = greedy("Hello world.", 8, ref_audio=ref, ref_text="The quick brown fox.", request_id="again")
    other = greedy("This is a test.", 8, ref_audio=ref, ref_text="The quick brown fox.", request_id="other")
    results = drive(core, {0: [first]})
    core.add_request(again)
    seq = core.scheduler.get("again")
    results.update(drive(core, {0: []}) if False else {})
    out = {"again": []}
    while core.has_work():
        for o in core.step():
            out[o.request_id].append(o)
    prompt_len = len(seq.position_keys)
    assert seq.num_cached == (prompt_len - 1) // 4 * 4 > 0         # all full blocks but the last position
    core.add_request(other)
    seq_other = core.scheduler.get("other")
    out["other"] = []
    while core.has_work():
        for o in core.step():
            out[o.request_id].append(o)
    assert seq_other.num_cached >= 8                                  # role + codec prefix with the x-vector
    # the counters the benchmark reports (prefix-cache reuse): every admitted prompt position, and the cached ones
    stats = core.stats()
    assert stats["prompt_tokens"] == 2 * prompt_len + len(seq_other.position_keys)
    assert stats["prompt_tokens_cached"] == seq.num_cached + seq_other.num_cached
    for req in (again, other):
        ref_codes, _, _ = reference("base", req)
        assert torch.equal(codes_of(core, req.request_id), ref_codes)
    assert np.array_equal(audio_of(out["again"]), audio_of(results["first"]))
    if graphs:                      # every prompt went through the runner, the hits from their cached length on
        assert [len(items) for _, items in runs] == [1, 1, 1]
        assert [items[0].start for _, items in runs] == [0, seq.num_cached, seq_other.num_cached]
    assert_all_released(core)


def test_tiny_kv_pool_preempts_and_every_request_finishes_correctly():
    core = make_engine(num_kv_blocks=14, block_size=4)      # 56 positions: about two requests at a time
    reqs = [greedy(t, n, voice=v, request_id=f"p{i}") for i, (t, n, v) in enumerate(
        [("Hello world.", 14, "vivian"), ("The quick brown fox.", 16, "ryan"), ("Speak happily.", 12, "eric"),
         ("This is a test.", 15, "sohee")])]
    results = drive(core, {0: reqs})
    assert core.stats()["preemptions"] > 0
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    assert_all_released(core)


def test_kv_reservation_queues_instead_of_preempting_and_every_request_finishes_correctly():
    """The same tiny pool with kv_reserve_frames covering every request's frames: requests wait for room instead
    of being preempted, and the codes are still the reference's."""
    core = make_engine(num_kv_blocks=14, block_size=4, kv_reserve_frames=16)
    assert core.scheduler.config.reserve_frames == 16
    reqs = [greedy(t, n, voice=v, request_id=f"r{i}") for i, (t, n, v) in enumerate(
        [("Hello world.", 14, "vivian"), ("The quick brown fox.", 16, "ryan"), ("Speak happily.", 12, "eric"),
         ("This is a test.", 15, "sohee")])]
    results = drive(core, {0: reqs})
    assert core.stats()["preemptions"] == 0
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    assert_all_released(core)


def test_nan_audio_ends_its_request_with_an_error_and_the_engine_goes_on():
    """A codec that decodes NaN (as an overflowing half-precision decoder would; here its output conv's bias is
    NaN) poisons that stream's codec state: the request ends with an error naming the fix, no NaN or zeroed chunk
    goes out, its slot, KV blocks and codec row come back, and the next request (in the reused codec row, reset
    on reuse) is served normally once the decoder is healthy again."""
    from voxflow.engine.engine_outputs import CODEC_NAN_ERROR
    core = make_engine(max_num_seqs=1)
    bias = core.codec.decoder.decoder[-1].conv.bias
    saved = bias.detach().clone()
    with torch.no_grad():
        bias.fill_(float("nan"))
    results = drive(core, {0: [greedy("Hello world.", 12, voice="vivian", request_id="bad")]})
    final = results["bad"][-1]
    assert final.reason is FinishReason.ERROR and final.error == CODEC_NAN_ERROR
    assert not any(isinstance(o, AudioChunk) for o in results["bad"])
    assert core.stats()["errors"] == 1 and core.stats()["codec_nonfinite_chunks"] >= 1
    assert_all_released(core)
    with torch.no_grad():
        bias.copy_(saved)
    req = greedy("Hello world.", 12, voice="vivian", request_id="good")
    results = drive(core, {0: [req]})
    assert results["good"][-1].reason is FinishReason.LENGTH
    assert_engine_matches_reference("custom_voice", core, results, [req])


def test_bad_requests_fail_alone_and_the_queue_has_a_limit():
    core = make_engine(max_waiting=2)
    with pytest.raises(ValueError, match="nobody"):
        core.add_request(greedy("Hello.", 5, voice="nobody"))
    with pytest.raises(ValueError):
        core.add_request(greedy("   ", 5, voice="vivian"))
    core.add_request(greedy("Hello.", 5, voice="vivian", request_id="ok1"))
    core.add_request(greedy("Hello.", 5, voice="vivian", request_id="ok2"))
    with pytest.raises(QueueFullError):
        core.add_request(greedy("Hello.", 5, voice="vivian", request_id="ok3"))
    results = drive(core, {})
    assert {r: o[-1].reason for r, o in results.items()} == {"ok1": FinishReason.LENGTH, "ok2": FinishReason.LENGTH}
    assert core.stats()["finished"] == 2
    assert core.stats()["codec_nonfinite_chunks"] == 0          # the codec's repaired-NaN counter is reported
    # and how the codec's precision was chosen (codec_dtype="auto" on a CPU: fp32, no check)
    assert core.stats()["startup"]["codec_precision"] == {"requested": "auto", "dtype": "float32", "why": "no GPU"}
    assert_all_released(core)


def test_request_that_can_never_fit_is_rejected_with_an_error_record():
    core = make_engine(num_kv_blocks=8, block_size=4)        # 32 positions
    results = drive(core, {0: [greedy("Hello world.", 200, voice="vivian", request_id="huge"),
                               greedy("Hi.", 5, voice="vivian", request_id="small")]})
    assert results["huge"][-1].reason is FinishReason.ERROR and "KV" in results["huge"][-1].error
    assert results["small"][-1].reason is FinishReason.LENGTH
    assert_all_released(core)


_shared_core = {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["add", "abort", "step", "step", "step"]),
                          st.integers(0, 3), st.integers(2, 14)), min_size=1, max_size=30))
def test_random_arrivals_aborts_and_lengths_keep_the_engine_consistent(ops):
    """Property: whatever arrives, aborts or runs out of memory, invariants hold after every step and at the
    end every request has exactly one final record and every block, slot and codec state is free."""
    if "core" not in _shared_core:
        _shared_core["core"] = make_engine(num_kv_blocks=12, block_size=4, max_num_seqs=3)
    core = _shared_core["core"]
    texts = ["Hello world.", "The quick brown fox.", "Hi.", "This is a tiny test of the quick brown fox."]
    finals: dict[str, int] = {}
    added = []
    for i, (op, a, n) in enumerate(ops):
        if op == "add":
            rid = f"q{i}"
            core.add_request(greedy(texts[a], n, voice="vivian", request_id=rid,
                                    streaming=StreamingOptions(initial_chunk_frames=1 + a, chunk_frames=3)))
            added.append(rid)
        elif op == "abort" and added:
            for o in core.abort(added[a % len(added)]):
                finals[o.request_id] = finals.get(o.request_id, 0) + 1
        else:
            for o in core.step():
                if not isinstance(o, AudioChunk):
                    finals[o.request_id] = finals.get(o.request_id, 0) + 1
        core.block_manager.check_invariants()
    while core.has_work():
        for o in core.step():
            if not isinstance(o, AudioChunk):
                finals[o.request_id] = finals.get(o.request_id, 0) + 1
        core.block_manager.check_invariants()
    assert finals == {rid: 1 for rid in added}
    assert_all_released(core)


def test_offline_batch_of_two_dozen_equals_one_by_one():
    core = make_engine(max_num_seqs=16, max_num_batched_tokens=160)
    texts = ["Hello world.", "The quick brown fox.", "Speak happily.", "This is a tiny test."]
    voices = ["vivian", "ryan", "aiden", "serena", "uncle_fu", "ono_anna"]
    reqs = [SpeechRequest(text=texts[i % 4], voice=voices[i % 6], request_id=f"{i:02d}",
                          sampling=SamplingOptions(greedy=True, max_new_tokens=6 + i % 7),
                          streaming=StreamingOptions(stream=False)) for i in range(24)]
    results = run_offline(core, reqs)
    for res in results:
        _, _, ref_wav = reference("custom_voice", res.request)
        wav = res.audio()
        assert wav.shape == ref_wav.shape and np.abs(wav - ref_wav).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_stored_voice_prompt_replaces_reference_audio():
    """A voice computed once with create_voice (plain data, JSON round trip) gives the same audio as sending the
    reference clip with every request."""
    import json
    t = np.arange(24000) / 24000
    ref = (0.2 * np.sin(2 * np.pi * 170 * t)).astype("<f4").tobytes()
    core = make_engine("base")
    info = core.info()
    assert info["task"] == "voice_clone" and info["sample_rate"] == 24000
    voice = json.loads(json.dumps(core.create_voice(ref, "The quick brown fox.", False)))
    by_clip = greedy("Hello world.", 10, ref_audio=ref, ref_text="The quick brown fox.", request_id="clip")
    by_voice = greedy("Hello world.", 10, voice_clone_prompt=voice, request_id="stored")
    results = drive(core, {0: [by_clip, by_voice]})
    assert torch.equal(codes_of(core, "clip"), codes_of(core, "stored"))
    assert np.abs(audio_of(results["clip"]) - audio_of(results["stored"])).max() <= AUDIO_ATOL
    with pytest.raises(ValueError, match="voice_clone_prompt"):
        core.add_request(greedy("Hi.", 5, voice_clone_prompt={"format": "qwen3_tts.voice.v1"}))
    # reference codes outside the codebook: refused when the voice is read (on the host), not at decode time
    import base64
    bad = np.frombuffer(base64.b64decode(voice["ref_codes"]), dtype="<i2").copy()
    bad[3] = 2048
    with pytest.raises(ValueError, match=r"outside \[0, 2048\)"):
        core.add_request(greedy("Hi.", 5, voice_clone_prompt={**voice, "ref_codes": base64.b64encode(
            bad.tobytes()).decode()}))
    cv = make_engine("custom_voice")
    assert set(cv.info()["voices"]) >= {"vivian", "ryan"}
    with pytest.raises(ValueError, match="Base"):
        cv.add_request(greedy("Hi.", 5, voice_clone_prompt=voice))


def test_request_longer_than_max_model_len_is_refused_at_once():
    core = make_engine(max_model_len=40)
    with pytest.raises(ValueError, match="at most 40"):
        core.add_request(greedy("Hello world.", 200, voice="vivian", request_id="long"))
    assert not core.live and core.scheduler.num_waiting == 0
    core.add_request(greedy("Hi.", 5, voice="vivian", request_id="short"))
    assert drive(core, {})["short"][-1].reason is FinishReason.LENGTH


def test_final_record_follows_the_last_chunk_and_no_frame_after_eos_is_kept():
    """The host reads finished flags one step late, so a request is decoded once more after it ended: that frame
    must never reach the codec, and the final record must come after every chunk."""
    core = make_engine()
    reqs = [greedy("Hello world.", 31, voice="vivian", request_id=f"r{i}") for i in range(3)]
    results = drive(core, {0: reqs[:2], 3: reqs[2:]})
    for req in reqs:
        outs = results[req.request_id]
        assert not isinstance(outs[-1], AudioChunk) and all(isinstance(o, AudioChunk) for o in outs[:-1])
        frames = sum(o.num_frames for o in outs[:-1])
        codes, _, _ = reference("custom_voice", req)
        assert frames == outs[-1].usage.frames == codes_of(core, req.request_id).shape[0] == codes.shape[0]
    assert_all_released(core)


@pytest.mark.parametrize("ramp_factor, tail, expected", [
    # factor 1: 2 -> 2 -> 2 (4 sent: 4 is no bucket) -> 5 (6 sent), regular 8 (11 sent), then the tail's pieces
    (1.0, 5, [2, 2, 2, 5, 8, 8, 3]),
    # the defaults (factor 2, tail pieces of 10, here wider than the 8-frame regular chunk): 2 -> 2 (4: no bucket)
    # -> 8 (4 sent x 2, the regular size), 8, 8, final 2
    (None, None, [2, 2, 8, 8, 8, 2]),
])
def test_engine_chosen_chunks_ramp_up_so_playback_never_waits(ramp_factor, tail, expected):
    """With chunk_frames left to the engine, each chunk after the first is at most the audio already sent times
    chunk_ramp_factor, rounded down to a size the codec decodes in one pass (its frame buckets 1, 2, 5, 10, 25),
    then the engine's regular size; the audio still equals the one-pass decode."""
    options = {} if ramp_factor is None else {"chunk_ramp_factor": ramp_factor, "codec_tail_chunk": tail}
    core = make_engine(chunk_frames=8, **options)
    assert core.codec_exec.sizes == (1, 2, 5, 10, 25)
    frames = 30
    req = greedy("Hello world.", frames + 1, voice="aiden", request_id="r",
                 streaming=StreamingOptions(initial_chunk_frames=2))
    results = drive(core, {0: [req]})
    sizes = [o.num_frames for o in results["r"] if isinstance(o, AudioChunk)]
    assert sizes == expected
    _, _, ref_wav = reference("custom_voice", req)
    assert np.abs(audio_of(results["r"]) - ref_wav).max() <= AUDIO_ATOL


@pytest.mark.parametrize("eager", [0, 4])
def test_a_first_chunk_leaves_with_the_step_that_decodes_its_frame(eager, monkeypatch):
    """A step's frames go to the codec when the step is queued: a first chunk is launched in the step that decodes
    its frame (behind that step on the GPU), not after the step is read. Lightly loaded (eager_first_chunk), the
    next step waits for the chunk only after queueing its own decode, so the talker never idles behind the codec;
    otherwise nothing waits for it. The audio is the same either way."""
    core = make_engine(eager_first_chunk=eager)
    req = greedy("Hello world.", 9, voice="vivian", request_id="r", streaming=StreamingOptions(initial_chunk_frames=1))
    steps, first_at, outs, launched_at, waits, decodes = 0, None, [], [], [], []
    launch, collect = core.codec_exec.launch, core.codec_exec.collect
    launch_decode = core._launch_decode
    monkeypatch.setattr(core, "_launch_decode", lambda seqs: decodes.append(steps) or launch_decode(seqs))

    def spy_launch(*args, **kwargs):
        n = launch(*args, **kwargs)
        if n:
            launched_at.append(steps)
        return n

    def spy_collect(block=False, block_oldest=False):
        if block or block_oldest:
            waits.append((steps, core._inflight is not None))     # a decode queued while the host waits?
        return collect(block=block, block_oldest=block_oldest)

    monkeypatch.setattr(core.codec_exec, "launch", spy_launch)
    monkeypatch.setattr(core.codec_exec, "collect", spy_collect)
    core.add_request(req)
    while core.has_work():
        steps += 1
        for o in core.step():
            outs.append(o)
            if isinstance(o, AudioChunk) and first_at is None:
                first_at = steps
    # step 1 prefill, step 2 queues the decode of frame 0 and its chunk behind it
    assert launched_at[0] == 2
    assert first_at == 2        # a CPU codec decodes as it is called (on a GPU the chunk leaves in step 3)
    if eager:
        assert waits[0] == (3, True)                # the wait for it: in step 3, with step 3's decode queued
    else:
        # nothing waits for the first chunk: the only blocking collect is the final drain, after the last decode
        assert waits and all(step > decodes[-1] and not queued for step, queued in waits)
    _, _, ref_wav = reference("custom_voice", req)
    assert np.abs(audio_of(outs) - ref_wav).max() <= AUDIO_ATOL


class _LandsLate:
    """A codec call's pending PCM that lands after `polls` ready() queries, or when waited for (result()); by default
    only then: a GPU codec's calls land some steps after their launch, by a load-dependent delay."""

    def __init__(self, pending, polls: float = math.inf):
        self._pending, self._polls = pending, polls

    def ready(self):
        self._polls -= 1
        return self._polls < 0

    def result(self):
        return self._pending.result()

    @property
    def nonfinite(self):
        return self._pending.nonfinite


def _gpu_like_codec(core, monkeypatch):
    """The CPU codec decodes as it is called; on a GPU a chunk is still running when the step that launched it
    collects: held back here until a blocking collect, as a GPU's would be."""
    decode_async = core.codec.decode_async
    monkeypatch.setattr(core.codec, "decode_async", lambda *a, **k: _LandsLate(decode_async(*a, **k)))


@pytest.mark.parametrize("abort", [False, True])
def test_a_first_chunk_still_running_is_waited_for_in_the_next_step_or_dropped_with_its_request(abort, monkeypatch):
    """With a codec whose chunks are still running when their step collects (a GPU's): the first-audio step
    launches the chunk, and the next step launches its decode and then waits for it -- the chunk leaves in step 3,
    as in one piece of audio with the rest. A request aborted between those steps gets no chunk, and nothing of it
    is kept."""
    core = make_engine(eager_first_chunk=4)
    _gpu_like_codec(core, monkeypatch)
    req = greedy("Hello world.", 9, voice="vivian", request_id="r", streaming=StreamingOptions(initial_chunk_frames=1))
    core.add_request(req)
    first = core.step() + core.step()                # the prefill; frame 0 decoded, its chunk launched
    assert not any(isinstance(o, AudioChunk) for o in first) and core._first_chunk_due
    if abort:
        assert [o.reason for o in core.abort("r")] == [FinishReason.ABORTED]
    later, steps = [], 2
    while core.has_work():
        steps += 1
        later += [(steps, o) for o in core.step()]
    chunks = [(step, o) for step, o in later if isinstance(o, AudioChunk)]
    if abort:
        assert not later and not core._first_chunk_due
    else:
        assert chunks[0][0] == 3 and chunks[0][1].first_frame == 0 and chunks[0][1].num_frames == 1
        _, _, ref_wav = reference("custom_voice", req)
        assert np.abs(audio_of(first + [o for _, o in later]) - ref_wav).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_a_length_limited_final_chunk_is_queued_behind_its_last_decode(monkeypatch):
    """A request that ends by length: its final chunk is launched in the step that queues its last decode (behind
    that step on the GPU, before the host reads it), not a step later after the read; the request is retired once
    that step is read and the chunk has landed, with every frame once and the audio of a one-pass decode."""
    core = make_engine()
    _gpu_like_codec(core, monkeypatch)
    req = greedy("Hello world.", 7, voice="vivian", request_id="r")
    ref_codes, ref_finish, ref_wav = reference("custom_voice", req)
    frames = ref_codes.shape[0]
    assert ref_finish == "length"
    finish, finished_at, decodes, finals = core.codec_exec.finish, [], [], []

    def spy_finish(rid):
        finished_at.append((core.steps, core._inflight is not None and core.live[rid] in core._inflight.seqs))
        finish(rid)

    monkeypatch.setattr(core.codec_exec, "finish", spy_finish)
    launch_decode = core._launch_decode
    monkeypatch.setattr(core, "_launch_decode", lambda seqs: decodes.append(core.steps) or launch_decode(seqs))
    decode = core.codec_exec._decode
    monkeypatch.setattr(core.codec_exec, "_decode", lambda group, frames_, final, when: (
        finals.extend(core.steps for f in final if f) or decode(group, frames_, final, when)))
    results, retired_at = {"r": []}, None
    core.add_request(req)
    while core.has_work():
        for o in core.step():
            results["r"].append(o)
            if isinstance(o, FinalRecord):
                retired_at = core.steps
    assert results["r"][-1].reason is FinishReason.LENGTH and results["r"][-1].usage.frames == frames
    # finished for the codec, and its final chunk launched, in the step of its last decode, that decode still
    # queued; retired in the next step, which reads that decode (and waits for the chunk)
    assert len(decodes) == frames and finished_at[0] == (decodes[-1], True)
    assert finals == [decodes[-1]] and retired_at == decodes[-1] + 1
    chunks = [o for o in results["r"] if isinstance(o, AudioChunk)]
    assert sum(c.num_frames for c in chunks) == frames
    assert [c.first_frame for c in chunks] == list(np.cumsum([0] + [c.num_frames for c in chunks[:-1]]))
    assert torch.equal(codes_of(core, "r"), ref_codes)
    assert np.abs(audio_of(results["r"]) - ref_wav).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_a_step_that_fails_before_queueing_its_decodes_frames_loses_none(monkeypatch):
    """A step can raise after launching its decode and before queueing that decode's frames to the codec (here:
    the codec's first launch; the engine's warm-up survives such a failure). The next step reads that decode and
    queues its frames then: the request goes on, every frame once, codes and audio the reference's."""
    core = make_engine()
    req = greedy("Hello world.", 9, voice="vivian", request_id="r")
    launch, failed = core.codec_exec.launch, []

    def failing_once(*args, **kwargs):
        if core.steps == 5 and not failed:
            failed.append(core.steps)
            raise RuntimeError("a codec launch failed")
        return launch(*args, **kwargs)

    monkeypatch.setattr(core.codec_exec, "launch", failing_once)
    core.add_request(req)
    outs = []
    while core.has_work():
        try:
            outs += core.step()
        except RuntimeError:
            assert core._inflight is not None and core._inflight.owners is None     # launched, not queued
    assert failed == [5]
    ref_codes, ref_finish, ref_wav = reference("custom_voice", req)
    assert outs[-1].reason.value == ref_finish and outs[-1].usage.frames == ref_codes.shape[0]
    assert torch.equal(codes_of(core, "r"), ref_codes)
    assert np.abs(audio_of(outs) - ref_wav).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_tail_chunks_split_a_length_limited_requests_last_frames_and_keep_its_audio():
    """codec_tail_chunk: the frames before a request's length limit go in small chunks as they come (the last with
    the final frame) instead of one final chunk after the talker's last step; the codes and the audio are the
    one-pass decode's."""
    core = make_engine(codec_tail_chunk=2)
    req = greedy("Hello world.", 12, voice="vivian", request_id="r",
                 streaming=StreamingOptions(initial_chunk_frames=2, chunk_frames=5))
    ref_codes, ref_finish, ref_wav = reference("custom_voice", req)
    assert ref_finish == "length"
    results = drive(core, {0: [req]})
    sizes = [o.num_frames for o in results["r"] if isinstance(o, AudioChunk)]
    frames = ref_codes.shape[0]
    # the first 2, then regular chunks of 5 while more than 5 are left, then pieces of 2, the final one 1..2
    want, done = [2], 2
    while frames - done > 5:
        want, done = want + [5], done + 5
    while frames - done > 2:
        want, done = want + [2], done + 2
    assert sizes == want + [frames - done] and 2 in want[2:], sizes      # (a tail piece before the final chunk)
    assert torch.equal(codes_of(core, "r"), ref_codes)
    assert np.abs(audio_of(results["r"]) - ref_wav).max() <= AUDIO_ATOL
    assert_all_released(core)


def test_a_ramp_factor_grows_the_engines_chunks_faster_and_keeps_the_audio():
    """chunk_ramp_factor: with the chunk size left to the engine, each growing chunk is at most that many times the
    audio already sent (rounded down to a one-pass size): at 2 the second chunk is 2 frames after a 1-frame first
    (at 1: 1 again); the codes and the audio are the one-pass decode's either way."""
    req = greedy("Hello world.", 12, voice="vivian", request_id="r",
                 streaming=StreamingOptions(initial_chunk_frames=1))
    ref_codes, _, ref_wav = reference("custom_voice", req)
    sizes = {}
    for factor in (1.0, 2.0):
        core = make_engine(codec_tail_chunk=0, chunk_ramp_factor=factor)
        results = drive(core, {0: [req]})
        sizes[factor] = [o.num_frames for o in results["r"] if isinstance(o, AudioChunk)]
        assert torch.equal(codes_of(core, "r"), ref_codes)
        assert np.abs(audio_of(results["r"]) - ref_wav).max() <= AUDIO_ATOL
        assert_all_released(core)
    assert sizes[1.0][:2] == [1, 1] and sizes[2.0][:2] == [1, 2], sizes
    assert len(sizes[2.0]) < len(sizes[1.0]), sizes


def _run_lagging(monkeypatch, call_rows, with_late):
    """Three requests that end in the same step (and, with_late, one more added once the first has retired, as a
    closed-loop client would) on an engine whose codec calls land only when waited for. Returns the engine, the
    outputs per request, the step each final record came in, and how many codec calls were in flight when the late
    request's prefill had run."""
    core = make_engine(codec_call_rows=call_rows)
    _gpu_like_codec(core, monkeypatch)
    reqs = [greedy("Hello world.", 6, voice="vivian", request_id=f"r{i}") for i in range(3)]
    late = greedy("The quick brown fox.", 5, voice="ryan", request_id="late")
    for r in reqs:
        core.add_request(r)
    results = {r.request_id: [] for r in reqs + ([late] if with_late else [])}
    finals_at, prefilled_beside = {}, None
    while core.has_work():
        for out in core.step():
            results[out.request_id].append(out)
            if isinstance(out, FinalRecord):
                finals_at[out.request_id] = core.steps
        if with_late and finals_at and "late" not in core.live and not results["late"]:
            core.add_request(late)
        elif prefilled_beside is None and "late" in core.live and core.live["late"].prefilled_at is not None:
            prefilled_beside = core.codec_exec.calls_in_flight
    assert_engine_matches_reference("custom_voice", core, results, reqs + ([late] if with_late else []))
    assert_all_released(core)
    return [finals_at[r.request_id] for r in reqs], prefilled_beside


@pytest.mark.parametrize("call_rows", [1, None])
def test_requests_ending_together_retire_call_by_call(monkeypatch, call_rows):
    """codec_call_rows=1: three requests that end in the same step get their final chunks in three codec calls;
    with the talker idle the engine waits for the oldest call only, so they retire in three consecutive steps
    (without it: one call, one step). Codes and audio are the reference's either way."""
    steps, _ = _run_lagging(monkeypatch, call_rows, with_late=False)
    assert steps == ([steps[0], steps[0] + 1, steps[0] + 2] if call_rows == 1 else [steps[0]] * 3), steps


@pytest.mark.parametrize("call_rows", [1, None])
def test_a_closed_loop_clients_next_request_prefills_beside_the_bursts_codec_calls(monkeypatch, call_rows):
    """codec_call_rows=1: a request added once the first of three has retired is prefilled while the other two
    final-chunk calls are still in flight, rather than after the whole burst's codec work (one call without it:
    nothing left in flight by then). Codes and audio are the reference's."""
    steps, prefilled_beside = _run_lagging(monkeypatch, call_rows, with_late=True)
    assert prefilled_beside == (2 if call_rows == 1 else 0)
    assert steps[0] < steps[1] if call_rows == 1 else steps == [steps[0]] * 3


@pytest.mark.parametrize("call_rows", [1, None])
def test_new_requests_wait_for_a_codec_state_held_by_one_still_finishing(monkeypatch, call_rows):
    """Codec states are one per slot, and a request whose talker work is done keeps its state until its final chunk
    is collected, so a new request can get the slot first. On a 2-slot engine whose codec calls land only when
    waited for: with codec_call_rows=1, two requests end together and two new ones arrive once the first has retired
    (the idle engine waited for the oldest call only); by default, a short and a long request run with a third
    queued, which takes the short one's slot while the long one keeps the engine busy (no wait for the codec). The
    new requests' first chunks wait for a free state (before: the codec raised CodecPoolFullError and the step
    failed); every request's codes and audio are the reference's."""
    core = make_engine(max_num_seqs=2, codec_call_rows=call_rows)
    _gpu_like_codec(core, monkeypatch)
    if call_rows == 1:
        first = [greedy("Hello world.", 6, voice="vivian", request_id=f"r{i}") for i in range(2)]
        late = [greedy("The quick brown fox.", 5, voice="ryan", request_id=f"late{i}") for i in range(2)]
    else:
        first = [greedy("Hello world.", 4, voice="vivian", request_id="short"),
                 greedy("Hello world.", 14, voice="vivian", request_id="long")]
        late = [greedy("The quick brown fox.", 5, voice="ryan", request_id="queued")]
    for r in first + ([] if call_rows == 1 else late):
        core.add_request(r)
    results = {r.request_id: [] for r in first + late}
    added, starved = call_rows != 1, 0
    while core.has_work():
        outs = core.step()
        starved += core.codec_exec.row_starved
        for out in outs:
            results[out.request_id].append(out)
        if not added and any(isinstance(o, FinalRecord) for o in outs):
            added = True
            for r in late:
                core.add_request(r)
    assert starved > 0                      # the situation arose: a first chunk waited for a state
    assert_engine_matches_reference("custom_voice", core, results, first + late)
    assert_all_released(core)


_gpu_like_cores: dict = {}


# (300 examples passed locally: session 33)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["add", "abort", "step", "step", "step"]),
                          st.integers(0, 3), st.integers(2, 14)), min_size=1, max_size=30),
       st.integers(0, 12), st.sampled_from([None, 1, 2]), st.sampled_from([0, 2]))
# a short request ends while two long ones keep the talker busy, and a queued one takes its slot while its final
# chunk is still in flight (the codec-state case of test_new_requests_wait_for_a_codec_state_held_by_one_...)
@example([("add", 2, 2), ("add", 3, 14), ("add", 1, 14), ("add", 0, 6)], 12, None, 0)
def test_random_traffic_with_a_codec_that_lands_late_keeps_every_request_whole(ops, lag, call_rows, tail):
    """Property, with codec calls that land `lag` polls after their launch (as a GPU's do; the synchronous CPU codec
    hides this; no eager first-chunk wait, as under load), codec calls of at most call_rows requests and tail
    chunks: whatever arrives (streamed, or whole for the longest text), aborts or queues for a slot (3 slots; a
    request whose talker work is done keeps its codec state until its last chunk is collected), every request gets
    exactly one final record, a request that ran to its end got chunks 0..k-1 covering its frames once, in order,
    and at the end every block, slot and codec state is free."""
    key = (call_rows, tail)
    if key not in _gpu_like_cores:
        core = make_engine(num_kv_blocks=24, block_size=4, max_num_seqs=3, codec_call_rows=call_rows,
                           eager_first_chunk=0, codec_tail_chunk=tail)
        decode_async = core.codec.decode_async
        core.codec_lag = [0]
        core.codec.decode_async = lambda *a, **k: _LandsLate(decode_async(*a, **k), core.codec_lag[0])
        _gpu_like_cores[key] = core
    core = _gpu_like_cores[key]
    try:
        _late_landing_traffic(core, ops, lag)
    except BaseException:
        del _gpu_like_cores[key]            # a failed example leaves its engine dirty: the next gets a fresh one
        raise


def _late_landing_traffic(core, ops, lag):
    core.codec_lag[0] = lag
    texts = ["Hello world.", "The quick brown fox.", "Hi.", "This is a tiny test of the quick brown fox."]
    outs: dict[str, list] = {}
    for i, (op, a, n) in enumerate(ops):
        if op == "add":
            rid = f"g{i}"
            core.add_request(greedy(texts[a], n, voice="vivian", request_id=rid,
                                    streaming=StreamingOptions(stream=a != 3, initial_chunk_frames=1 + a,
                                                               chunk_frames=3)))
            outs[rid] = []
        elif op == "abort" and outs:
            rids = list(outs)
            for o in core.abort(rids[a % len(rids)]):
                outs[o.request_id].append(o)
        else:
            for o in core.step():
                outs[o.request_id].append(o)
        core.block_manager.check_invariants()
    while core.has_work():
        for o in core.step():
            outs[o.request_id].append(o)
        core.block_manager.check_invariants()
    for rid, got in outs.items():
        finals = [o for o in got if isinstance(o, FinalRecord)]
        assert len(finals) == 1 and got[-1] is finals[0], rid
        chunks = [o for o in got if isinstance(o, AudioChunk)]
        assert [c.index for c in chunks] == list(range(len(chunks))), rid
        starts = [sum(c.num_frames for c in chunks[:j]) for j in range(len(chunks))]
        assert [c.first_frame for c in chunks] == starts, rid
        if finals[0].reason in (FinishReason.LENGTH, FinishReason.EOS):
            assert sum(c.num_frames for c in chunks) == finals[0].usage.frames > 0, rid
    assert_all_released(core)
    assert core.codec.pool.num_free == core.codec.pool.max_rows


def test_first_audio_latency_is_split_into_its_parts():
    """stats()["ttfp_breakdown_ms"]: the mean of each TTFP part over the requests that got audio; the parts after
    the prompt build add up to the time from queueing to the first chunk (the final record's own timestamps)."""
    core = make_engine()
    assert core.stats()["ttfp_breakdown_ms"] == {}
    reqs = [greedy("Hello there.", 6, voice="vivian", request_id=f"r{i}") for i in range(2)]
    results = drive(core, {0: reqs[:1], 3: reqs[1:]})
    parts = core.stats()["ttfp_breakdown_ms"]
    assert list(parts) == ["prepare", "queue_and_prefill", "first_frame", "first_chunk"]
    assert all(v >= 0 for v in parts.values()) and parts["prepare"] > 0
    finals = [results[r.request_id][-1] for r in reqs]
    waited_ms = sum(f.first_chunk_at - f.arrived_at for f in finals) / len(finals) * 1e3
    after_prepare = parts["queue_and_prefill"] + parts["first_frame"] + parts["first_chunk"]
    assert abs(after_prepare - waited_ms) <= 0.05 + 1e-3 * waited_ms


def test_step_trace_has_one_line_per_step_that_accounts_for_every_request(tmp_path, monkeypatch):
    """trace_steps: a JSON line per served step whose counts add up to what the engine did (requests added, decode
    rows = frames made, chunks and final records out), with step numbers in order."""
    from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
    codec_captured = [0.0]
    monkeypatch.setattr(Qwen3CodecRunner, "capture_seconds", property(lambda self: codec_captured[0]))
    path = tmp_path / "steps.jsonl"
    core = make_engine(trace_steps=str(path), trace_profile_prepare=True)
    decode_async = core.codec.decode_async

    def decode_capturing_once(*args, **kwargs):
        if codec_captured[0] == 0.0:                    # and a codec capture, 20 ms, on its first launch
            codec_captured[0] = 0.02
        return decode_async(*args, **kwargs)
    core.codec.decode_async = decode_capturing_once
    run, calls = core.runner.run, []

    def run_capturing_once(*args, **kwargs):
        # A capture while serving (CUDA only) shows in its step's line: simulated as 50 ms on the third decode.
        calls.append(1)
        if len(calls) == 3:
            core.runner.stats.capture_seconds += 0.05
        return run(*args, **kwargs)
    core.runner.run = run_capturing_once
    reqs = [greedy("Hello there.", 6, voice="vivian", request_id=f"r{i}") for i in range(3)]
    results = drive(core, {0: reqs[:2], 4: reqs[2:]})
    core.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, core.steps + 1))
    assert sum(r["added"] for r in lines) == 3 and lines[0]["added"] == 2 and lines[0]["prepare_ms"] > 0
    outs = [o for rs in results.values() for o in rs]
    assert sum(r["chunks"] for r in lines) == sum(isinstance(o, AudioChunk) for o in outs)
    assert sum(r["finished"] for r in lines) == 3
    # Every frame handed to the codec came from a traced decode row (the one-step-late extra decode makes more).
    assert sum(r["decode"] for r in lines) >= sum(len(codes_of(core, r.request_id)) for r in reqs)
    assert all((r["prefill"] > 0) == (r["prefill_tokens"] > 0) for r in lines) and sum(r["prefill"] for r in lines) >= 3
    assert all(b["t"] >= a["t"] for a, b in zip(lines, lines[1:]))
    assert set(lines[0]["ms"]) == {"schedule", "prefill", "launch_decode", "collect_decode", "first_chunk_wait",
                                   "emit_early", "intake", "codec_launch", "codec_collect"}
    assert all(r["early_chunks"] == r["early_finished"] == 0 and r["ms"]["emit_early"] == 0 for r in lines)  # off
    assert all(r["ms"]["intake"] == 0 for r in lines)                                                         # off
    assert all(r["ms"]["first_chunk_wait"] >= 0 and r["ms"]["collect_decode"] >= 0 for r in lines)
    assert all(r["gc_ms"] >= 0 for r in lines)
    # codec calls launched and not collected at a step's end: none left once every request has finished
    assert all(isinstance(r["codec_in_flight"], int) and r["codec_in_flight"] >= 0 for r in lines)
    assert lines[-1]["codec_in_flight"] == 0 and lines[-1]["finished"] > 0
    assert not any(r["codec_starved"] for r in lines)           # a CPU codec's calls land at once: no wait
    captures = [r for r in lines if r["capture_ms"]]
    assert sorted(r["capture_ms"] for r in captures) == [20.0, 50.0]
    assert all(r["decode"] > 0 for r in captures if r["capture_ms"] == 50.0)
    assert all(r["codec_launched"] > 0 for r in captures if r["capture_ms"] == 20.0)
    import pstats                   # the prompt builds were profiled: the model's prepare_many is in the statistics
    stats = pstats.Stats(str(path) + ".prepare.pstats")
    assert any(func[2] == "prepare_many" and calls[1] >= 3 for func, calls in stats.stats.items())


def test_step_trace_counts_time_in_the_garbage_collector(tmp_path):
    """gc_ms: the collector's time since the previous line (a full collection over a big heap is not free), and
    the trace unhooks itself from the collector when closed."""
    import gc

    from voxflow.engine.step_trace import StepTrace
    path = tmp_path / "t.jsonl"
    trace = StepTrace(str(path))
    heap = [[i] for i in range(300_000)]            # something for a full collection to walk
    gc.collect()
    trace.write({"step": 1})
    trace.close()
    del heap
    assert json.loads(path.read_text().splitlines()[0])["gc_ms"] > 0
    assert trace._on_gc not in gc.callbacks


def test_the_startup_freeze_is_no_steps_collection(tmp_path):
    """The serving process freezes its startup objects after the engine and its trace are built
    (gc_freeze.freeze_core_startup): that full collection is startup's, not the first step's gc_ms."""
    import gc

    from voxflow.engine.gc_freeze import freeze_core_startup, freeze_startup_objects
    core = make_engine("custom_voice", trace_steps=str(tmp_path / "t.jsonl"))
    heap = [[i] for i in range(300_000)]            # something for the freeze's collection to walk
    try:
        freeze_startup_objects()
        assert core.trace._gc_s > 1e-3              # counted: the walk takes milliseconds
        gc.unfreeze()
        freeze_core_startup(core)
        assert core.trace._gc_s < 1e-3 and gc.get_freeze_count() > len(heap)
    finally:
        gc.unfreeze()
        del heap
        core.shutdown()


@pytest.mark.parametrize("name", ["custom_voice", "voice_design", "base"])
def test_warmup_requests_run_before_serving_and_leave_no_trace(name):
    """The model's warm-up requests (run at startup on a GPU; forced here) go through the engine and leave it as
    new: no live request, every block free, counters, step timings and TTFP parts at zero."""
    core = make_engine(name, warmup_requests=True)
    assert "warmup_error" not in core.startup and core.startup["warmup_seconds"] > 0
    stats = core.stats()
    assert stats["steps"] == 0 and stats["finished"] == 0 and stats["audio_seconds"] == 0.0
    assert stats["ttfp_breakdown_ms"] == {} and not any(stats["step_seconds"].values())
    assert_all_released(core)
    results = drive(core, {0: [greedy("Hello.", 4, voice="vivian" if name == "custom_voice" else None,
                                      instructions="A calm voice." if name == "voice_design" else None,
                                      request_id="after")]} if name != "base" else {})
    if name != "base":
        assert results["after"][-1].reason == FinishReason.LENGTH


def test_voice_clone_in_bfloat16_runs_and_shares_its_prefix():
    """Base (voice clone) requests in bf16, the GPU's default dtype: from reference audio (x-vector only and ICL)
    and from a stored voice. The voice's prefix-cache keys come from the host data it was made from (reading a bf16
    x-vector back to hash it failed, and would stall the host behind the decode in flight): a repeat of the same
    clip hits the cache through the reference frames, and the stored form of a voice decodes the same codes."""
    t = np.arange(24000) / 24000
    ref = (0.2 * np.sin(2 * np.pi * 150 * t)).astype("<f4").tobytes()
    core = make_engine("base", block_size=4, dtype="bfloat16")
    icl = dict(ref_audio=ref, ref_text="The quick brown fox.")
    reqs = [greedy("Hello world.", 6, ref_audio=ref, x_vector_only=True, request_id="xvec"),
            greedy("Hello world.", 6, **icl, request_id="icl")]
    results = drive(core, {0: reqs})
    again = greedy("Hello world.", 6, **icl, request_id="again")
    core.add_request(again)
    seq = core.scheduler.get("again")
    results.update(drive(core, {0: []}))
    frames = len(core.model.model.codec_encoder.encode(torch.from_numpy(np.frombuffer(ref, "<f4").copy())))
    assert seq.num_cached > frames                          # past the reference frames: keyed by the clip
    assert torch.equal(codes_of(core, "again"), codes_of(core, "icl"))
    stored = core.create_voice(ref, "The quick brown fox.", False)
    core.add_request(greedy("Hello world.", 6, voice_clone_prompt=stored, request_id="stored"))
    results.update(drive(core, {0: []}))
    assert torch.equal(codes_of(core, "stored"), codes_of(core, "icl"))
    for rid in ("xvec", "icl", "again", "stored"):
        assert len(codes_of(core, rid)) == 5 and results[rid][-1].error is None
    assert_all_released(core)


def test_same_step_prefix_reuse_keeps_the_prefill_order():
    """Two identical prompts and a shorter one in one step: the second reuses the pages the first computes in that
    same step (block_manager's ordering rule), so the step's chunks keep their order (no sorting by length) and
    every request still gets the reference's codes through the (padded) prefill runner."""
    name = "custom_voice_1b7"
    core = make_engine(name, prefill_graphs=True, packed_prefill=False, block_size=4)
    long = "The quick brown fox jumps over the lazy dog, twice over, and then once more for luck."
    reqs = [greedy(long, 6, voice="ryan", language="english", request_id="x"),
            greedy(long, 6, voice="ryan", language="english", request_id="y"),
            greedy("Speak.", 6, voice="eric", language="auto", request_id="z")]
    orders = []
    independent = core.prefill.independent
    core.prefill.independent = lambda chunks: (orders.append(independent(chunks)), orders[-1])[1]
    results = drive(core, {0: reqs})
    assert orders[0] is False                                   # "y" reads what "x" writes in the same step
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)


@pytest.mark.parametrize("max_tokens,mixed,chunk", [(96, False, None), (40, False, None), (96, True, None),
                                                    (96, False, 16)], ids=["96", "40", "96-mixed", "96-chunked"])
def test_prefill_runner_static_shapes_equal_the_reference(max_tokens, mixed, chunk):
    """The prefill-graph path (voxflow/engine/prefill_runner.py), run eagerly on the CPU: whole prompts padded to a
    length bucket (and the batch to a batch bucket) in static buffers give every request the reference's codes.
    With a 40-token budget only 32-query buckets exist (a longer prompt's chunks replay as queries over their
    context, one that arrives whole runs eagerly). Mixed:
    three prompts in one step that no single bucket holds within 96 tokens run as two replays, the two short ones
    in a (2, 32) bucket (2 pages of 16), then the long one alone. Chunked: prompts prefilled 16 positions a step, every
    chunk through the runner from position 0 (a first chunk's request already holds all its prompt's pages)."""
    name = "custom_voice_1b7"
    # Mixed: pages of 16, so the three prompts share no full page (with pages of 4 their common template prefix is
    # a same-step reuse, which keeps the order).
    core = make_engine(name, prefill_graphs=True, packed_prefill=False, max_num_batched_tokens=max_tokens,
                       prefill_chunk_size=chunk, block_size=16 if mixed else 4)
    runner = core.prefill_runner
    assert runner is not None and not runner.cuda_graphs
    reqs = [greedy("Hello world.", 10, voice="vivian", request_id="a"),
            greedy("Speak.", 7, voice="eric", language="auto", request_id="b"),
            greedy("This is a tiny test.", 9, voice="serena", instructions="Speak happily.", request_id="c"),
            greedy("The quick brown fox jumps over the lazy dog, twice over, and then once more for luck.", 6,
                   voice="ryan", language="english", request_id="d")]
    used = []
    run = runner.run
    runner.run = lambda key, items: (used.append((key, len(items))), run(key, items))
    if mixed:                 # the long one first: independent chunks are sorted, the two short ones share a bucket
        reqs = [reqs[3], reqs[0], reqs[1]]
        results = drive(core, {0: reqs})
        assert used[0] == ((2, 32, 2), 2) and used[1][1] == 1     # then the long one (or its first chunk) alone
    elif chunk:
        reqs = [reqs[3], reqs[0]]
        results = drive(core, {0: reqs[:1], 1: reqs[1:]})
        assert sum(n for _, n in used) >= 4                 # the 36-position prompt in 16 + 16 + 4, then "a"
    elif max_tokens == 96:
        results = drive(core, {0: reqs[:2], 2: reqs[2:]})
        assert any(n == 2 for _, n in used)               # two prompts padded into one batch bucket
    else:                     # one at a time, 32-query buckets only: the 36-position prompt is cut by the budget
        results = drive(core, {0: reqs[:1], 3: reqs[1:2], 5: reqs[2:3], 7: reqs[3:]})
        assert [n for _, n in used] == [1] * len(used) and len(used) >= 3
        assert all(key[1] == 32 for key, _ in used)
    assert all(key[0] >= n and key in runner.shapes for key, n in used)
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)


def test_long_streaming_texts_read_their_pages_as_the_reference_reads_its_text():
    """Trailing text in shared pages (qwen3_tts/slots.py): a streaming-text prompt of ~300 text rows (more than the
    256 a slot once had: the H200 voice-clone run's first long text reallocated every slot's buffer and recaptured
    the decode graphs) gets scattered pages (a short request's page freed just before), is served beside others
    with graph_epoch unchanged, and all of them give the reference's codes for 119 frames (four pages read);
    afterwards every page is free again."""
    core = make_engine("custom_voice", max_num_seqs=4)
    slots = core.model.slots
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    reqs = [greedy("Hello there, you.", 3, voice="vivian", non_streaming_mode=False, request_id="short"),
            greedy("A second, longer sentence to keep going.", 40, voice="ryan", non_streaming_mode=False,
                   request_id="mid"),
            greedy(long, 120, voice="vivian", non_streaming_mode=False, request_id="long")]
    assert core.model.prepare(reqs[2]).state.trailing_text.shape[0] > 256
    pages, epoch, free = {}, core.model.graph_epoch, len(slots._free_pages)
    load_texts = slots._load_texts

    def recording(slot_list, rows, texts):
        load_texts(slot_list, rows, texts)
        for slot, trailing in zip(slot_list, texts):
            pages[trailing.shape[0]] = list(slots._slot_pages.get(slot, []))
    slots._load_texts = recording
    results = drive(core, {0: reqs[:2], 8: reqs[2:]})
    long_pages = pages[max(pages)]
    assert long_pages != list(range(long_pages[0], long_pages[0] + len(long_pages)))      # not one contiguous run
    assert core.model.graph_epoch == epoch
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    assert len(slots._free_pages) == free and not slots._slot_pages
    assert_all_released(core)


def test_frame_history_holds_the_longest_request_the_engine_accepts():
    """The slot table's frame history is sized by max_model_len (a request longer than the history would grow it
    while serving, and every decode graph would be captured again)."""
    core = make_engine(max_model_len=3000)
    assert core.model.slots.history.shape[1] == 3000
    assert make_engine().model.slots.history.shape[1] == EngineConfig(model="").max_model_len



@pytest.mark.parametrize("case", ["together", "budget-40", "chunked", "same-step-reuse"])
def test_packed_prefill_equals_the_reference(case):
    """The packed prefill (voxflow/engine/packed_prefill.py), run eagerly on the CPU: a step's chunks end to end as
    one row of tokens, each token attending to its own sequence's pages up to itself, give every request the
    reference's codes. Together: three prompts in one packed run, a fourth later. Budget 40: the scheduler cuts
    the prompts into chunks over several steps, one 64-row run a step (cutting a step into runs:
    tests/test_packed_prefill.py). Chunked: 16 positions a step, later chunks
    reading their earlier pages. Same-step reuse: two identical prompts (pages of 4), the second reading pages the
    first writes in the same packed run (written in each layer before any row attends)."""
    name = "custom_voice_1b7"
    budget = 40 if case == "budget-40" else 96
    core = make_engine(name, prefill_graphs=True, packed_prefill=True, max_num_batched_tokens=budget,
                       prefill_chunk_size=16 if case == "chunked" else None)
    runner = core.prefill_runner
    assert runner is not None and runner.packed and not runner.cuda_graphs
    runs = []
    run = runner.run
    runner.run = lambda key, items: (runs.append((key, [(i.start, i.end) for i in items],
                                                  [i.block_table[0] for i in items])), run(key, items))
    long = "The quick brown fox jumps over the lazy dog, twice over, and then once more for luck."
    if case == "same-step-reuse":
        reqs = [greedy(long, 6, voice="ryan", language="english", request_id="x"),
                greedy(long, 6, voice="ryan", language="english", request_id="y"),
                greedy("Speak.", 6, voice="eric", language="auto", request_id="z")]
    else:
        reqs = [greedy("Hello world.", 10, voice="vivian", request_id="a"),
                greedy("Speak.", 7, voice="eric", language="auto", request_id="b"),
                greedy("This is a tiny test.", 9, voice="serena", instructions="Speak happily.", request_id="c"),
                greedy(long, 6, voice="ryan", language="english", request_id="d")]
    if case == "together":
        results = drive(core, {0: reqs[:3], 2: reqs[3:]})
        assert len(runs[0][1]) == 3                                   # three prompts, one run
    else:
        results = drive(core, {0: reqs})
    for (tokens, width), spans, _ in runs:
        assert sum(e - s for s, e in spans) <= tokens and (tokens, width) in runner.shapes
        assert max(e for _, e in spans) <= width * core.config.block_size
    if case == "budget-40":
        assert all(tokens == 64 for (tokens, _), _, _ in runs) and len(runs) >= 3
    if case == "chunked":
        assert any(s > 0 for _, spans, _ in runs for s, _ in spans)  # a later chunk over its earlier pages
    if case == "same-step-reuse":
        (_, spans, first_pages), = runs[:1]
        assert len(spans) == 3 and first_pages[0] == first_pages[1]  # y reads the page x writes, in the same run
    assert runner.stats.eager_steps == len(runs)
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)


def test_frame_listeners_get_each_requests_frames_as_they_go_to_the_codec():
    """add_frame_listener: a listener sees every step's frames with their owners, so a request's rows are its codes
    (what batch `voxflow synthesize --save-codes` writes): equal to the reference's, and nothing for padding rows."""
    core = make_engine()
    seen: dict[str, list] = {}

    def listener(frames, owners):
        for i, rid in enumerate(owners):
            if rid is not None:
                seen.setdefault(rid, []).append(frames[i].clone())
    core.add_frame_listener(listener)
    reqs = [greedy("Hello world.", 9, voice="vivian", request_id="a"),
            greedy("A second, longer one.", 13, voice="vivian", request_id="b")]
    drive(core, {0: reqs[:1], 2: reqs[1:]})
    assert set(seen) == {"a", "b"}
    for r in reqs:
        ref_codes, _, _ = reference("custom_voice", r)
        assert torch.equal(torch.stack(seen[r.request_id]), ref_codes)


def test_the_talkers_norms_folded_in_place_serve_the_reference_codes(monkeypatch):
    """qwen3_layer.FOLDED_NORMS_PAGED on: the loader folds the talker's norm weights into its q|k|v and gate|up
    weights in place (folded_norms.fold_norms_in_place: on a GPU its folded decode step then needs no copies); the
    fp32 engine's greedy codes stay the unfolded reference's (only the roundings moved) and its audio within
    AUDIO_ATOL."""
    from voxflow.layers import qwen3_layer
    monkeypatch.setattr(qwen3_layer, "FOLDED_NORMS_PAGED", True)
    core = make_engine()
    layers = core.model.model.talker.model.layers
    assert all(getattr(lay, "norms_folded_in_place", False) for lay in layers)
    assert all(torch.equal(lay.input_layernorm.weight, torch.ones_like(lay.input_layernorm.weight)) for lay in layers)
    ref = reference_model("custom_voice").talker.model.layers[0]
    assert not torch.equal(layers[0].self_attn.q_proj.weight, ref.self_attn.q_proj.weight)     # really folded
    reqs = [greedy("Hello world.", 14, voice="vivian", request_id="a"),
            greedy("This is a tiny test.", 17, voice="serena", request_id="b")]
    results = drive(core, {0: reqs})
    assert_engine_matches_reference("custom_voice", core, results, reqs)


def test_the_code_predictors_final_norm_folded_into_its_heads_serves_the_reference_codes(monkeypatch):
    """code_predictor.CP_FOLDED_HEAD on: the loader folds the code predictor's final norm weight into its 15
    lm_heads in place (folded_norms.fold_final_norm_in_place; on a GPU its draws then scale the logits); the fp32
    engine's greedy codes stay the unfolded reference's (only the roundings moved) and its audio within AUDIO_ATOL."""
    from voxflow.models.qwen3_tts import code_predictor
    monkeypatch.setattr(code_predictor, "CP_FOLDED_HEAD", True)
    core = make_engine()
    cp = core.model.model.talker.code_predictor
    assert getattr(cp.model.norm, "folded_into_heads", False)
    assert torch.equal(cp.model.norm.weight, torch.ones_like(cp.model.norm.weight))
    ref = reference_model("custom_voice").talker.code_predictor
    assert not torch.equal(cp.lm_head[3].weight, ref.lm_head[3].weight)          # really folded
    reqs = [greedy("Hello world.", 14, voice="vivian", request_id="a"),
            greedy("This is a tiny test.", 17, voice="serena", request_id="b")]
    results = drive(core, {0: reqs})
    assert_engine_matches_reference("custom_voice", core, results, reqs)


@pytest.mark.parametrize("packed", [False, True], ids=["eager-prefill", "packed"])
def test_decode_queued_before_the_prefill_keeps_every_requests_codes(packed):
    """EngineConfig.decode_before_prefill: a step that has both queues its running streams' decode first and its
    new prompts' prefill after (the GPU decodes while the host builds the prefill). The two touch disjoint slots and
    KV pages, so every request still gets the reference's codes and audio, with requests joining while others
    decode (both in one step) and a chunked prompt spread over steps beside decodes."""
    name = "custom_voice_1b7"
    core = make_engine(name, decode_before_prefill=True, prefill_graphs=packed or None, packed_prefill=packed,
                       prefill_chunk_size=16)
    order: list[tuple[int, str]] = []
    launch, prefills = core._launch_decode, core._run_prefills
    core._launch_decode = lambda seqs: (order.append((core.steps, "decode")), launch(seqs))[1]
    core._run_prefills = lambda chunks: (order.append((core.steps, "prefill")), prefills(chunks))[1]
    long = "The quick brown fox jumps over the lazy dog, twice over, and then once more for luck."
    reqs = [greedy("Hello world.", 14, voice="vivian", request_id="a"),
            greedy(long, 9, voice="ryan", language="english", request_id="b"),
            greedy("This is a tiny test.", 12, voice="serena", instructions="Speak happily.", request_id="c")]
    results = drive(core, {0: reqs[:1], 3: reqs[1:2], 5: reqs[2:]})
    both = [s for s, what in order if what == "prefill" and (s, "decode") in order]
    assert len(both) >= 2                                  # steps that decoded and prefilled
    for s in both:
        assert order.index((s, "decode")) < order.index((s, "prefill"))
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)


def test_decode_queued_before_the_prefill_keeps_seeded_sampling():
    """decode_before_prefill with sampling: seeded requests joining while a sampled one decodes (a step then decodes
    and attaches, which also changes the decode variant's sampling settings) draw the same codes in either order."""
    def sampled(rid, seed, text):
        return SpeechRequest(text=text, voice="vivian", request_id=rid,
                             sampling=SamplingOptions(seed=seed, max_new_tokens=12, top_k=20, temperature=0.8))
    runs = []
    for first in (False, True):
        core = make_engine(decode_before_prefill=first)
        drive(core, {0: [sampled("a", 3, "The quick brown fox.")],
                     2: [sampled("b", 4, "Hello world."), sampled("c", 5, "Speak happily, please.")]})
        runs.append(core)
    for rid in "abc":
        assert codes_of(runs[0], rid).shape[0] > 2
        assert torch.equal(codes_of(runs[0], rid), codes_of(runs[1], rid)), rid


def test_a_prefill_that_fails_after_its_steps_decode_was_queued_loses_no_frame(monkeypatch):
    """decode_before_prefill: a step's prefill can raise after the step queued its decode (the warm-up survives a
    failed step: it then aborts its requests). The previous decode is read at once and the queued one by the next
    step, so the request that was decoding goes on with every frame once (dropping the queued decode lost one);
    the request whose prefill failed is aborted, and everything is given back."""
    core = make_engine(decode_before_prefill=True)
    reqs = [greedy("Hello world.", 12, voice="vivian", request_id="a"),
            greedy("This is a tiny test.", 8, voice="vivian", request_id="b")]
    run_prefills, failed = core._run_prefills, []

    def failing_once(chunks):
        if any(c.seq.request_id == "b" for c in chunks) and not failed:
            failed.append(core.steps)
            raise RuntimeError("a prefill failed")
        return run_prefills(chunks)
    monkeypatch.setattr(core, "_run_prefills", failing_once)
    results: dict[str, list] = {"a": []}
    core.add_request(reqs[0])
    step = 0
    while core.has_work():
        if step == 3:
            core.add_request(reqs[1])
        try:
            for out in core.step():
                results.setdefault(out.request_id, []).append(out)
        except RuntimeError:
            assert core._inflight is not None and core._inflight.owners is None     # queued, not yet read
            core.abort("b")
        step += 1
    assert failed and results["a"][-1].reason.value == "length"
    assert_engine_matches_reference("custom_voice", core, results, reqs[:1])
    assert_all_released(core)


class _Clock:
    """A GPU's time for a CPU engine, in ticks: a decode in flight is done 4 ticks after its launch, a codec call
    lands 6 ticks after its launch (inside the next-but-one step's wait); each poll of a decode's event is a tick,
    and waiting for it (synchronize) jumps to its end."""

    def __init__(self):
        self.now = 0

    def decode(self):
        clock, done = self, self.now + 4

        class Event:
            def query(self):
                clock.now += 1
                return clock.now >= done

            def synchronize(self):
                clock.now = max(clock.now, done)
        return Event()

    def codec_call(self, pending):
        clock, lands = self, self.now + 6

        class Landing:
            def ready(self):
                return clock.now >= lands

            def result(self):
                clock.now = max(clock.now, lands)
                return pending.result()

            @property
            def nonfinite(self):
                return pending.nonfinite
        return Landing()


def _clocked_engine(monkeypatch, **kw):
    """make_engine(**kw) timed by a _Clock: its decodes carry the clock's events, its codec calls land by it."""
    core = make_engine(**kw)
    clock = _Clock()
    decode_async = core.codec.decode_async
    monkeypatch.setattr(core.codec, "decode_async", lambda *a, **k: clock.codec_call(decode_async(*a, **k)))
    launch = core._launch_decode

    def launch_running(seqs):
        inflight = launch(seqs)
        inflight.event = clock.decode()
        return inflight
    monkeypatch.setattr(core, "_launch_decode", launch_running)
    return core, clock


def _three_requests(prefix="w"):
    return [greedy(text, n, voice="vivian", request_id=f"{prefix}{i}")
            for i, (text, n) in enumerate((("Hello world.", 9), ("The quick brown fox.", 6), ("Hi.", 12)))]


def _run_with_waits(monkeypatch, emit_while_waiting: bool):
    """Three requests of different lengths on an engine timed by a _Clock. Returns the engine, the requests and the
    outputs in the order they left, each with the tick it left at and whether it left early (emit_early)."""
    core, clock = _clocked_engine(monkeypatch, emit_while_waiting=emit_while_waiting)
    left = []
    core.emit_early = lambda outs: left.extend((clock.now, True, o) for o in outs)
    reqs = _three_requests()
    for r in reqs:
        core.add_request(r)
    while core.has_work():
        outs = core.step()
        left.extend((clock.now, False, o) for o in outs)
    assert_all_released(core)
    return core, reqs, left


def _key(o):
    return (o.request_id, "final") if isinstance(o, FinalRecord) else (o.request_id, o.index)


def test_outputs_leave_while_the_host_waits_for_the_decode_and_are_the_same(monkeypatch):
    """emit_while_waiting: the chunks that land while the host waits for the decode in flight, and the finals they
    complete, leave through emit_early during that wait, earlier than the step's end would give them; each
    request's outputs are the same, in the same order, and the reference's audio. Off: all leave at step ends."""
    core, reqs, on = _run_with_waits(monkeypatch, True)
    _, _, off = _run_with_waits(monkeypatch, False)
    assert not any(early for _, early, _ in off)
    early = [o for _, e, o in on if e]
    assert any(isinstance(o, AudioChunk) for o in early) and any(isinstance(o, FinalRecord) for o in early)
    results = {r.request_id: [o for _, _, o in on if o.request_id == r.request_id] for r in reqs}
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    for r in reqs:
        got, want = ([(type(o), getattr(o, "index", None), getattr(o, "pcm", None), getattr(o, "reason", None))
                      for _, _, o in run if o.request_id == r.request_id] for run in (on, off))
        assert got == want, r.request_id
    # each output left no later than without the switch; the early ones before the step's end would have
    # given them
    at_off = {_key(o): t for t, _, o in off}
    assert all(t <= at_off[_key(o)] for t, _, o in on)
    assert sum(t < at_off[_key(o)] for t, e, o in on if e) == len(early)


def _early_total(core) -> int:
    return core._early_chunks + core._early_finals


def test_the_offline_runner_and_the_driver_take_early_outputs(monkeypatch):
    """run_offline and CoreDriver.step(emit=...) hand the engine their output handling for its early outputs: with
    emit_while_waiting on, some leave early, and every request is whole (chunks in order, its final last) and the
    reference's."""
    from voxflow.engine.inprocess import CoreDriver
    from voxflow.engine.offline import run_offline
    sent = []
    monkeypatch.setattr(EngineCore, "_emit_while_waiting", _counting(EngineCore._emit_while_waiting, sent))
    core, _ = _clocked_engine(monkeypatch, emit_while_waiting=True)
    reqs = _three_requests("o")
    results = run_offline(core, reqs)
    assert sum(sent) > 0 and core.emit_early is None
    assert_engine_matches_reference("custom_voice", core, {r.request.request_id: [*r.chunks, r.final]
                                                          for r in results}, reqs)
    sent.clear()
    core, _ = _clocked_engine(monkeypatch, emit_while_waiting=True)
    driver, got = CoreDriver(core), []
    reqs = _three_requests("d")
    driver.add_many(reqs)
    while driver.has_work():
        got += driver.step(emit=got.extend)
    assert sum(sent) > 0 and core.emit_early is None and not driver.live
    assert_engine_matches_reference("custom_voice", core, {r.request_id: [o for o in got if o.request_id ==
                                                                          r.request_id] for r in reqs}, reqs)


def _counting(real, sent: list):
    def spied(self, event):
        before = _early_total(self)
        error = real(self, event)
        sent.append(_early_total(self) - before)
        return error
    return spied


def test_an_early_emit_that_fails_raises_from_a_whole_step(monkeypatch):
    """An emit_early that raises ends the step's polling; the step finishes (the decode it waited for read, the
    codec launched) and raises the error; the engine goes on from there and every request that still has a record
    ends whole."""
    core, _ = _clocked_engine(monkeypatch, emit_while_waiting=True)
    reqs = _three_requests("f")
    for r in reqs:
        core.add_request(r)
    got, failed = [], []

    def emit(outs):
        if not failed:
            failed.append([o.request_id for o in outs])
            raise RuntimeError("the client is gone")
        got.extend(outs)
    core.emit_early = emit
    steps_before = None
    while core.has_work():
        steps_before = core.steps
        try:
            got += core.step()
        except RuntimeError as e:
            assert str(e) == "the client is gone" and core.steps == steps_before + 1
            core.block_manager.check_invariants()
    assert failed                                   # it raised once, mid-run
    assert_all_released(core)
    for r in reqs:
        outs = [o for o in got if o.request_id == r.request_id]
        chunks = [o.index for o in outs if isinstance(o, AudioChunk)]
        assert chunks == sorted(chunks) and all(not isinstance(o, FinalRecord) for o in outs[:-1])


def test_the_driver_hands_a_steps_early_outputs_on_for_live_requests_only():
    """CoreDriver.step(emit=...): the core's early outputs go to `emit` at once, those of a request aborted meanwhile
    dropped and a final record ending its request there; the hook is the core's only for that step."""
    from voxflow.engine.inprocess import CoreDriver

    class Core:
        emit_early = None

        def step(self):
            self.emit_early([AudioChunk("a", 0, b"", 24000, 0, 0, 1), AudioChunk("gone", 0, b"", 24000, 0, 0, 1),
                             FinalRecord("a", FinishReason.LENGTH)])
            return [AudioChunk("b", 0, b"", 24000, 0, 0, 1)]
    core = Core()
    driver = CoreDriver(core)
    driver.live |= {"a", "b"}
    sent = []
    assert [o.request_id for o in driver.step(emit=sent.extend)] == ["b"]
    assert [(type(o).__name__, o.request_id) for o in sent] == [("AudioChunk", "a"), ("FinalRecord", "a")]
    assert driver.live == {"b"} and core.emit_early is None
