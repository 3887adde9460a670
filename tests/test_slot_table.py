"""The Qwen3 plugin's slot table (slots.py). Its scalars: a load writes exactly the request's row. Its trailing
text in shared pages: a long text borrows the pages that short ones leave free, so the buffers the decode CUDA graphs hold are not reallocated (a reallocation bumps `version`, and every
graph is captured again as its batch size comes up: a stall of every stream on the GPU). What each slot reads back
must be exactly its own rows, then tts_pad."""
from __future__ import annotations

import torch

from voxflow.models.qwen3_tts.slots import NEVER, SCALARS, TEXT_PAGE_ROWS, SlotTable

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
    rows = torch.full((frames,), slot)
    return t.text_part(rows, k, pad, t.trailing_len[rows])


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
    # reloading a slot (preempted and attached again) gives back its old pages first; the others read the same
    free = len(t._free_pages)
    one = load(t, 1, 1, seed=5)
    assert len(t._free_pages) == free + 1
    assert torch.equal(read_back(t, 1, 3), expect(one, 3))
    assert torch.equal(read_back(t, 0, 10 * TEXT_PAGE_ROWS), expect(again, 10 * TEXT_PAGE_ROWS))
    assert torch.equal(read_back(t, 2, 10), expect(third, 10))
    # no text at all: tts_pad from the first frame (an empty table row reads page 0, masked)
    load(t, 2, 0, seed=6)
    assert torch.equal(read_back(t, 2, 3), torch.full((3, H), -7.0))
    # the engine's serving path, long texts against the reference: tests/test_engine.py


def test_a_load_writes_the_request_row_of_every_scalar_and_nothing_else():
    t = table()
    before = {k: v.clone() for k, v in t._scalars.items()}
    params = type("P", (), dict(do_sample=True, temperature=0.7, top_k=33, top_p=0.9, subtalker_do_sample=False,
                                subtalker_temperature=0.5, subtalker_top_k=5, subtalker_top_p=0.8,
                                repetition_penalty=1.05, min_new_tokens=2))()
    t.c0[1], t.fed[1], t.h[1], t.seen[1, 3] = 9, 4, 1.0, True            # a previous request's leftovers
    t.load(1, params=params, key=12345, prompt_len=17, max_frames=99, ignore_eos=True,
           trailing=torch.ones(5, H))
    want = dict(c0=0, fed=0, prompt_len=17, trailing_len=5, t_top_k=33, cp_top_k=5, min_new_tokens=NEVER,
                key=12345, max_frames=99, t_temperature=0.7, cp_temperature=1.0, penalty=1.05, t_top_p=0.9,
                cp_top_p=0.8, t_do_sample=True, cp_do_sample=False)     # greedy stage: neutral temperature
    assert set(want) == {name for names in SCALARS.values() for name in names}
    for name, value in want.items():
        got = getattr(t, name)[1].item()
        assert got == (torch.tensor(value, dtype=getattr(t, name).dtype).item()), name
    assert not t.h[1].any() and not t.seen[1].any()
    for kind, tensor in t._scalars.items():                               # the other slots untouched
        assert torch.equal(tensor[:, [0, 2, 3]], before[kind][:, [0, 2, 3]])
    # a batch's gather: every name's values of those slots, in batch order, each a contiguous row (c0 and fed made
    # distinct first: after a load both are 0, and a gather that swapped them would pass)
    t.c0[1], t.fed[1], t.c0[3], t.fed[3] = 9, 4, 5, 2
    rows = torch.tensor([1, 3, 1])
    g = t.gather(rows)
    for name in want:
        got = getattr(g, name)
        assert got.is_contiguous() and torch.equal(got, getattr(t, name)[rows]), name
    assert g.c0.tolist() == [9, 5, 9] and g.fed.tolist() == [4, 2, 4]
    assert torch.equal(g.talker_params().top_k, t.t_top_k[rows])
    assert torch.equal(g.cp_params().temperature, t.cp_temperature[rows])



def _loads(seed: int, sizes: list[int], slots: list[int]):
    from voxflow.models.qwen3_tts.slots import SlotLoad
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (slot, rows) in enumerate(zip(slots, sizes)):
        params = type("P", (), dict(do_sample=bool(i % 2), temperature=0.5 + i, top_k=3 + i, top_p=0.9,
                                    subtalker_do_sample=not i % 2, subtalker_temperature=0.7, subtalker_top_k=5 + i,
                                    subtalker_top_p=0.8, repetition_penalty=1.0 + i / 10, min_new_tokens=i))()
        out.append(SlotLoad(slot, params, 1000 + i, 10 + i, 6 + i, i == 2, torch.randn(rows, H, generator=g)))
    return out


def test_loading_several_slots_at_once_equals_loading_them_one_by_one():
    """load_many (the engine attaches a step's new requests together) leaves every tensor of the table as the same
    loads one at a time do: scalars, page assignment, page table, text rows; here with texts of 0 to 3 pages, one
    filling its pages exactly, more pages than are free (the pool grows once), and a slot's leftovers reset."""
    sizes, slots = [2 * TEXT_PAGE_ROWS + 5, 0, TEXT_PAGE_ROWS, 3 * TEXT_PAGE_ROWS], [2, 0, 3, 1]
    one, many = table(max_slots=4, cap=TEXT_PAGE_ROWS), table(max_slots=4, cap=TEXT_PAGE_ROWS)
    for t in (one, many):
        t.h[3], t.seen[3, 5], t.c0[3] = 2.0, True, 7              # a previous request's leftovers
    for x in _loads(1, sizes, slots):
        one.load(x.slot, params=x.params, key=x.key, prompt_len=x.prompt_len, max_frames=x.max_frames,
                 ignore_eos=x.ignore_eos, trailing=x.trailing)
    many.load_many(_loads(1, sizes, slots))
    assert one.version == many.version == 1                        # 7 pages needed, 4 free: grown once each way
    for name in ("h", "seen", "history", "text_pages", "text_table"):
        assert torch.equal(getattr(one, name), getattr(many, name)), name
    for kind in SCALARS:
        assert torch.equal(one._scalars[kind], many._scalars[kind]), kind
    assert one._slot_pages == many._slot_pages and one._free_pages == many._free_pages
    for x in _loads(1, sizes, slots):                              # and each slot reads back its own text
        frames = x.trailing.shape[0] + 2
        assert torch.equal(read_back(many, x.slot, frames), expect(x.trailing, frames))


def test_loading_several_slots_at_once_takes_as_many_tensor_operations_as_loading_one():
    """The point of load_many: on a GPU each tensor operation is a launch on the engine thread, so a step's new
    requests cost one set of them, not one set each."""
    from torch.profiler import ProfilerActivity, profile

    def ops(n: int) -> int:
        t = table(max_slots=8, cap=2 * TEXT_PAGE_ROWS)
        loads = _loads(2, [TEXT_PAGE_ROWS + 1] * n, list(range(n)))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t.load_many(loads)
        return sum(e.name.startswith("aten::") and e.cpu_parent is None for e in prof.events())
    assert ops(6) == ops(2)
