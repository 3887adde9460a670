"""The real engine (tiny Qwen3-TTS) behind both clients: same audio in-process and out-of-process, model info and
stored voices over the wire, and a killed engine process reported to every waiting request."""
import asyncio
import functools
import os
import signal

import numpy as np
import pytest

from voxflow.engine.client import EngineUnavailableError
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.inprocess import InProcessEngineClient
from voxflow.engine.process import ProcessEngineClient
from voxflow.engine.request import AudioChunk, FinishReason, SamplingOptions, SpeechRequest, StreamingOptions

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")


def config(name, **kw):
    return EngineConfig(model=os.path.join(TINY, name), max_num_seqs=4, max_num_batched_tokens=64,
                        num_kv_blocks=128, block_size=4, **kw)


def request(rid, text="Hello world.", n=10, **kw):
    return SpeechRequest(text=text, voice="vivian", request_id=rid, sampling=SamplingOptions(greedy=True,
                         max_new_tokens=n), streaming=StreamingOptions(initial_chunk_frames=1, chunk_frames=4), **kw)


async def collect(client, req):
    chunks, final = [], None
    async for out in client.generate(req):
        if isinstance(out, AudioChunk):
            chunks.append(out)
        else:
            final = out
    pcm = np.concatenate([np.frombuffer(c.pcm, "<f4") for c in chunks]) if chunks else np.zeros(0, np.float32)
    return pcm, final


def test_process_and_inprocess_give_the_same_audio_and_info():
    async def main():
        inproc = InProcessEngineClient(EngineCore.from_config(config("custom_voice")))
        proc = ProcessEngineClient(functools.partial(EngineCore.from_config, config("custom_voice")),
                                   startup_timeout=120)
        async with inproc, proc:
            assert proc.model_info == inproc.model_info
            assert proc.model_info["task"] == "custom_voice" and "vivian" in proc.model_info["voices"]
            texts = ["Hello world.", "The quick brown fox.", "Speak happily."]
            a = await asyncio.gather(*(collect(inproc, request(f"i{i}", t)) for i, t in enumerate(texts)))
            b = await asyncio.gather(*(collect(proc, request(f"p{i}", t)) for i, t in enumerate(texts)))
            for (pa, fa), (pb, fb) in zip(a, b):
                assert fa.reason is fb.reason is FinishReason.LENGTH
                assert pa.shape == pb.shape == (9 * 1920,)
                assert np.abs(pa - pb).max() <= 1e-5
            bad, final = await collect(proc, request("bad", text="   "))
            assert final.reason is FinishReason.ERROR and final.error_kind == "invalid_request"
            health = await proc.health()
            assert health["alive"] and health["stats"]["running"] == 0
            assert proc.startup["kv_cache_blocks"] == 128 and proc.startup["startup_seconds"] >= 0
    asyncio.run(main())


def test_an_engine_process_that_spins_when_idle_serves_requests_one_after_another():
    """idle_spin_ms: the engine process polls without sleeping for a while after its last work; requests sent one
    after another (each arriving within that window, one after it) are served as without it: the in-process
    engine's audio."""
    async def main():
        inproc = InProcessEngineClient(EngineCore.from_config(config("custom_voice")))
        proc = ProcessEngineClient(functools.partial(EngineCore.from_config, config("custom_voice", idle_spin_ms=200)),
                                   startup_timeout=120)
        async with inproc, proc:
            for i, text in enumerate(["Hello world.", "Speak happily.", "The quick brown fox."]):
                if i == 2:
                    await asyncio.sleep(0.3)            # past the spin window: asleep in poll(), woken by the add
                (pa, fa), (pb, fb) = await collect(inproc, request(f"i{i}", text)), \
                    await collect(proc, request(f"p{i}", text))
                assert fa.reason is fb.reason is FinishReason.LENGTH
                assert pa.shape == pb.shape and np.abs(pa - pb).max() <= 1e-5
    asyncio.run(main())


def test_idle_poll_timeout_spins_only_within_the_window_after_the_last_work():
    from voxflow.engine.inprocess import CoreDriver

    class Core:
        def __init__(self, spin_ms):
            self.config = EngineConfig(model="unused", idle_spin_ms=spin_ms)

        def step(self):
            return []
    off, on = CoreDriver(Core(0.0)), CoreDriver(Core(5.0))
    now = on.last_work
    assert off.idle_poll_timeout(off.last_work) is None            # off: block at once
    assert on.idle_poll_timeout(now + 0.001) == 0.0                 # within 5 ms of the last work: poll
    assert on.idle_poll_timeout(now + 0.006) is None                # after: block
    on.step()                                                       # new work restarts the window
    assert on.idle_poll_timeout(on.last_work + 0.004) == 0.0


def test_create_voice_over_the_process_boundary():
    async def main():
        t = np.arange(24000) / 24000
        ref = (0.2 * np.sin(2 * np.pi * 160 * t)).astype("<f4").tobytes()
        async with ProcessEngineClient(functools.partial(EngineCore.from_config, config("base")),
                                       startup_timeout=120) as proc:
            voice = await proc.create_voice(ref, "The quick brown fox.", False)
            assert voice["frames"] == 13
            with pytest.raises(ValueError):
                await proc.create_voice(b"", None, True)
            stored, f1 = await collect(proc, request("s", voice_clone_prompt=voice))
            clip, f2 = await collect(proc, request("c", ref_audio=ref, ref_text="The quick brown fox."))
            assert f1.reason is f2.reason is FinishReason.LENGTH
            assert np.abs(stored - clip).max() <= 1e-5
    asyncio.run(main())


def test_killed_engine_process_ends_waiting_requests():
    async def main():
        proc = ProcessEngineClient(functools.partial(EngineCore.from_config, config("custom_voice")),
                                   startup_timeout=120)
        await proc.start()
        try:
            gen = proc.generate(request("long", n=400))
            first = await asyncio.wait_for(gen.__anext__(), 60)
            assert isinstance(first, AudioChunk)
            os.kill(proc.pid, signal.SIGKILL)
            rest = [out async for out in gen]
            assert rest[-1].reason is FinishReason.ERROR and rest[-1].error_kind == "engine_died"
            assert "engine died" in rest[-1].error
            assert not (await proc.health())["alive"]
            with pytest.raises(EngineUnavailableError):
                await collect(proc, request("after"))
        finally:
            await proc.shutdown(drain=False)
    asyncio.run(asyncio.wait_for(main(), 120))


class EarlyCore:
    """A core whose step hands its first chunk to `emit_early` (as EngineCore does with emit_while_waiting, while
    it waits for the decode in flight) and returns the second chunk and the final record at its end."""

    def __init__(self):
        self.emit_early = None
        self.waiting = []

    def info(self):
        return {"name": "early", "family": "test", "task": "custom_voice", "sample_rate": 24000,
                "voices": ["vivian"], "languages": ["auto"], "supports_instructions": False}

    def add_request(self, request):
        self.waiting.append(request.request_id)

    def abort(self, request_id):
        self.waiting.remove(request_id)

    def has_work(self):
        return bool(self.waiting)

    def stats(self):
        return {"running": len(self.waiting), "waiting": 0}

    def shutdown(self):
        pass

    def step(self):
        rid = self.waiting.pop(0)
        pcm = np.full(1920, 0.25, "<f4").tobytes()
        self.emit_early([AudioChunk(rid, 0, pcm, 24000, 1920, 0, 1)])
        from voxflow.engine.request import FinalRecord, Usage
        return [AudioChunk(rid, 1, pcm, 24000, 1920, 1, 1), FinalRecord(rid, FinishReason.LENGTH, Usage(1, 2, 0.16))]


def test_the_engine_process_sends_a_steps_early_outputs_before_its_own():
    """process.py's loop hands its driver the socket's send for the step's early outputs: a chunk the core has
    ready mid-step reaches the client, before the step's own chunk and final record, in order."""
    async def main():
        async with ProcessEngineClient(EarlyCore, startup_timeout=60) as proc:
            outs = [o async for o in proc.generate(request("e"))]
            assert [(type(o).__name__, getattr(o, "index", None)) for o in outs] == [
                ("AudioChunk", 0), ("AudioChunk", 1), ("FinalRecord", None)]
    asyncio.run(main())
