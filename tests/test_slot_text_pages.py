"""The slot table's trailing text in shared pages (slots.py): a long text borrows the pages that short ones leave
free, so the buffers the decode CUDA graphs hold are not reallocated (a reallocation bumps `version`, and every
graph is captured again as its batch size comes up: a stall of every stream on the GPU). What each slot reads back
must be exactly its own rows, then tts_pad."""
from __future__ import annotations

import os

import numpy as np
import torch

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.offline import run_offline
from voxflow.engine.request import SamplingOptions, SpeechRequest, StreamingOptions
from voxflow.models.qwen3_tts.slots import TEXT_PAGE_ROWS, SlotTable

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
H = 4


def table(max_slots: int = 3, cap: int = 2 * TEXT_PAGE_ROWS) -> SlotTable:
    return SlotTable(max_slots, H, vocab=8, num_groups=2, dtype=torch.float32, device=torch.device("cpu"),
                     trailing_cap=cap)


def load(t: SlotTable, slot: int, rows: int, seed: int) -> torch.Tensor:
    text = torch.randn(rows, H, generator=torch.Generator().manual_seed(seed))
    params = type("P", (), dict(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, subtalker_do_sample=False,
                                subtalker_temperature=1.0, subtalker_top_k=0, subtalker_top_p=1.0,
                                repetition_penalty=1.0, min_new_tokens=0))()
    t.load(slot, params=params, key=0, prompt_len=1, max_frames=4, ignore_eos=False, trailing=text)
    return text


def read_back(t: SlotTable, slot: int, frames: int) -> torch.Tensor:
    pad = torch.full((H,), -7.0)
    k = torch.arange(frames)
    return t.text_part(torch.full((frames,), slot), k, pad)


def expect(text: torch.Tensor, frames: int) -> torch.Tensor:
    pad = torch.full((frames - text.shape[0], H), -7.0)
    return torch.cat([text, pad])


def test_a_long_text_takes_free_pages_without_a_reallocation():
    t = table()                                            # 3 slots x 2 pages = 6 pages
    long = load(t, 0, 4 * TEXT_PAGE_ROWS - 3, seed=1)      # 4 pages: more than its "share" of 2
    short = load(t, 1, TEXT_PAGE_ROWS + 1, seed=2)         # 2 pages
    assert t.version == 0
    assert torch.equal(read_back(t, 0, 5 * TEXT_PAGE_ROWS), expect(long, 5 * TEXT_PAGE_ROWS))
    assert torch.equal(read_back(t, 1, 3 * TEXT_PAGE_ROWS), expect(short, 3 * TEXT_PAGE_ROWS))
    # no page left: the next text grows the pool (version bumps), and what was there reads the same
    third = load(t, 2, 3, seed=3)
    assert t.version == 1
    assert torch.equal(read_back(t, 0, 5 * TEXT_PAGE_ROWS), expect(long, 5 * TEXT_PAGE_ROWS))
    assert torch.equal(read_back(t, 2, 10), expect(third, 10))
    # released pages are reused (no growth); the neighbours are untouched
    t.release_text(0)
    again = load(t, 0, 9 * TEXT_PAGE_ROWS, seed=4)         # 9 pages: the 4 freed + 5 of the grown pool
    assert t.version == 1
    assert torch.equal(read_back(t, 0, 10 * TEXT_PAGE_ROWS), expect(again, 10 * TEXT_PAGE_ROWS))
    assert torch.equal(read_back(t, 1, 3 * TEXT_PAGE_ROWS), expect(short, 3 * TEXT_PAGE_ROWS))
    assert torch.equal(read_back(t, 2, 10), expect(third, 10))
    # reloading a slot (preempted and attached again) gives back its old pages first
    free = len(t._free_pages)
    load(t, 1, 1, seed=5)
    assert len(t._free_pages) == free + 1
    # no text at all: tts_pad from the first frame (the padding slot's table row reads page 0, masked)
    load(t, 2, 0, seed=6)
    assert torch.equal(read_back(t, 2, 3), torch.full((3, H), -7.0))


def test_engine_serves_a_long_streaming_text_without_growing_slot_buffers():
    """A streaming-text prompt whose text outruns the 256 rows a slot used to have (the H200 voice-clone run's
    first long text reallocated every slot's buffer): served beside short ones, graph_epoch unchanged, and its
    audio is what it gets served alone (float rounding aside)."""
    long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)
    cfg = dict(model=os.path.join(TINY, "custom_voice"), device="cpu", dtype="float32", max_num_seqs=4,
               num_kv_blocks=512, block_size=16)

    def req(i, text):
        return SpeechRequest(text=text, voice="vivian", request_id=str(i), streaming=StreamingOptions(stream=False),
                             non_streaming_mode=False, sampling=SamplingOptions(greedy=True, max_new_tokens=6))
    core = EngineCore.from_config(EngineConfig(**cfg))
    trailing = core.model.prepare(req(9, long_text)).state.trailing_text.shape[0]
    assert trailing > 256                                  # the case that grew the per-slot buffers
    epoch = core.model.graph_epoch
    together = run_offline(core, [req(0, "Hello there."), req(1, long_text), req(2, "A short one.")])
    assert core.model.graph_epoch == epoch
    alone = run_offline(EngineCore.from_config(EngineConfig(**cfg)), [req(1, long_text)])
    got, want = together[1].audio(), alone[0].audio()
    assert got.size == want.size > 0
    assert np.abs(got - want).max() <= 1e-4            # batched with others vs alone: float rounding only
