"""The pooled, batched codec runner on CPU: every path must equal the one-pass decode of each request's frames.

The runner pads batches to buckets with a scratch row, cuts chunks into bucket-sized pieces and pads final chunks
(codec_runner.py); on CPU it runs the same pool gather -> decode -> scatter as the CUDA graphs replay, so these
tests hold the padding and pool logic to the reference (one pass of the fp32 decoder, tolerance 1e-5 as in
test_codec_decoder.py: only float rounding may differ). The GPU side (graphs, stream, bf16) is tests/gpu.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

from voxflow.models.qwen3_tts.codec_pool import CodecPoolFullError
from voxflow.models.qwen3_tts.codec_runner import FRAME_BUCKETS, Qwen3CodecRunner, frame_pieces
from voxflow.tools.codec_snr import load_codec_decoder, snr_db

torch.set_num_threads(1)
TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
UP = 1920
TOL = 1e-5


@pytest.fixture(scope="module")
def dec():
    return load_codec_decoder(os.path.join(TINY, "custom_voice"))


def codes_for(frames: int, seed: int) -> torch.Tensor:
    """[T, 16] random codes"""
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def one_pass(dec, codes: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return dec(codes.T[None])[0, 0].numpy()


def runner(dec, **kw) -> Qwen3CodecRunner:
    return Qwen3CodecRunner.from_decoder(dec, **kw)


def record_steps(r: Qwen3CodecRunner) -> list[tuple[int, int]]:
    """Spy on the pool step: the (batch, frames) shapes it runs."""
    shapes, step = [], r.pool.step
    r.pool.step = lambda rows, codes: (shapes.append(tuple(codes.shape[::2])), step(rows, codes))[1]
    return shapes


def test_frame_pieces():
    b = FRAME_BUCKETS
    assert frame_pieces(0, True, b) == ()
    assert frame_pieces(25, False, b) == frame_pieces(25, True, b) == (25,)
    assert frame_pieces(3, False, b) == (2, 1)                 # exact: a sum of buckets
    assert frame_pieces(24, False, b) == (10, 10, 2, 2)
    assert frame_pieces(3, True, b) == (5,)                    # final: one padded piece
    assert frame_pieces(61, True, b) == (25, 25, 25)
    assert frame_pieces(61, False, b) == (25, 25, 10, 1)
    assert frame_pieces(7, True, None) == frame_pieces(7, False, None) == (7,)
    for n in range(1, 80):
        assert sum(frame_pieces(n, False, b)) == n
        assert 0 <= sum(frame_pieces(n, True, b)) - n < 25


# request -> {call: chunk size}. Calls mix chunk sizes (grouped by pieces inside the runner: at call 3, a, b and e
# share 25-frame pieces, a batch of 3 padded to 4 with the scratch row, and the final chunks of c (10) and d (8,
# padded to 10) share one), requests join late and one sits a call out (b at call 2).
SCHEDULE = {
    "a": {0: 1, 1: 25, 2: 25, 3: 25, 4: 14},
    "b": {0: 1, 1: 25, 3: 25, 4: 9},
    "c": {1: 2, 2: 25, 3: 10},
    "d": {1: 5, 2: 3, 3: 8},
    "e": {2: 10, 3: 25, 4: 7, 5: 24, 6: 14},
}


@pytest.mark.parametrize("kw", [{}, {"batch_buckets": (1, 2), "frame_buckets": (1, 4)},
                                {"batch_buckets": None, "frame_buckets": None}],
                         ids=["default", "small_buckets", "exact"])
def test_pool_mixed_batches_equal_one_pass(dec, kw):
    r = runner(dec, max_rows=5, **kw)
    shapes = record_steps(r)
    total = {k: sum(sizes.values()) for k, sizes in SCHEDULE.items()}
    codes = {k: codes_for(total[k], seed=i) for i, k in enumerate(SCHEDULE)}
    states, done, pcm = {}, {k: 0 for k in SCHEDULE}, {k: [] for k in SCHEDULE}
    for call in range(7):
        batch = [k for k in SCHEDULE if call in SCHEDULE[k]]
        for k in batch:
            if k not in states:
                states[k] = r.new_state(None)
        frames = [codes[k][done[k]: done[k] + SCHEDULE[k][call]] for k in batch]
        final = [done[k] + SCHEDULE[k][call] == total[k] for k in batch]
        out, new_states = r.decode([states[k] for k in batch], frames, final)
        assert all(new is states[k] for new, k in zip(new_states, batch))      # updated in place
        for k, f, p in zip(batch, frames, out):
            assert p.dtype == np.float32 and p.shape == (f.shape[0] * UP,)
            pcm[k].append(p)
            done[k] += f.shape[0]
    for k in SCHEDULE:
        assert done[k] == total[k]
        assert np.abs(np.concatenate(pcm[k]) - one_pass(dec, codes[k])).max() <= TOL, k
    batches = {b for b, _ in shapes}
    if kw.get("batch_buckets", ()) is None:
        assert len({n for _, n in shapes}) > 5 and 3 in batches     # exact: every chunk and batch size as such
    else:
        assert batches <= set(r.batch_buckets) and len(batches) > 1  # padded batches only, several sizes
        assert {n for _, n in shapes} <= set(r.frame_buckets)
    if kw == {}:
        assert (4, 25) in shapes and (2, 10) in shapes


def test_padded_final_chunk_equals_unpadded(dec):
    codes = codes_for(33, seed=7)
    got = {}
    for name, buckets in (("padded", FRAME_BUCKETS), ("exact", None)):
        r = runner(dec, max_rows=1, frame_buckets=buckets)
        shapes = record_steps(r)
        s = r.new_state(None)
        first, _ = r.decode([s], [codes[:26]])
        last, _ = r.decode([s], [codes[26:]], final=[True])          # 7 frames: one piece of 10 when padded
        assert last[0].shape == (7 * UP,)
        got[name] = np.concatenate([first[0], last[0]])
        assert (shapes[-1] == (1, 10)) == (name == "padded"), shapes
    assert np.abs(got["padded"] - got["exact"]).max() <= TOL
    assert np.abs(got["padded"] - one_pass(dec, codes)).max() <= TOL


def test_padded_batch_entries_write_only_the_scratch_row(dec):
    r = runner(dec, max_rows=4)
    shapes = record_steps(r)
    states = [r.new_state(None) for _ in range(3)]
    idle = r.new_state(codes_for(6, seed=4))                          # live, but not in the next call
    idle_before = r.pool.read(idle.row)
    codes = [codes_for(10, seed=20 + i) for i in range(3)]
    for at in (0, 5):
        out, _ = r.decode(states, [c[at: at + 5] for c in codes])
        for c, p in zip(codes, out):
            assert np.abs(p - one_pass(dec, c[: at + 5])[at * UP:]).max() <= TOL
    assert shapes[-2:] == [(4, 5), (4, 5)]                            # 3 requests padded to the bucket of 4
    idle_after = r.pool.read(idle.row)
    assert all(torch.equal(idle_before.tensors[k], v) for k, v in idle_after.tensors.items())
    assert r.pool.read(r.pool.scratch_row).frames.item() > 0           # the padding landed there


def test_rows_are_reused_without_leaking_state(dec):
    a_codes, b_codes, prefix = codes_for(40, seed=1), codes_for(30, seed=2), codes_for(12, seed=3)
    r = runner(dec, max_rows=2)
    a = r.new_state(None)
    keep = r.new_state(None)
    r.decode([a, keep], [a_codes[:20], a_codes[20:40]])
    r.decode([a], [a_codes[20:]], final=[True])
    row = a.row
    r.release(a)
    r.release(a)                                                     # idempotent
    kept_before = r.pool.read(keep.row)

    # B (with a voice-clone prefix) in A's old row == B in a fresh pool == one pass over prefix + B, tail
    b = r.new_state(prefix)
    assert b.row == row
    b_pcm = np.concatenate([r.decode([b], [b_codes[i: i + 10]])[0][0] for i in range(0, 30, 10)])
    fresh = runner(dec, max_rows=2)
    fb = fresh.new_state(prefix)
    fresh_pcm = np.concatenate([fresh.decode([fb], [b_codes[i: i + 10]])[0][0] for i in range(0, 30, 10)])
    assert np.array_equal(b_pcm, fresh_pcm)
    want = one_pass(dec, torch.cat([prefix, b_codes]))[12 * UP:]
    assert np.abs(b_pcm - want).max() <= TOL
    # a live row that took no part in those calls is untouched (padded batch entries write the scratch row)
    kept_after = r.pool.read(keep.row)
    assert all(torch.equal(kept_before.tensors[k], v) for k, v in kept_after.tensors.items())

    # a handle that is merely dropped gives its row back too (safety net for callers that never release)
    assert r.pool.num_free == 0
    del b
    gc.collect()
    assert r.pool.num_free == 1


def test_pool_exhaustion_is_a_clear_error(dec):
    r = runner(dec, max_rows=2)
    held = [r.new_state(None), r.new_state(None)]
    with pytest.raises(CodecPoolFullError, match="no free codec state row for 1 new stream.*0 of 2 rows free"):
        r.new_state(None)
    r.release(held[0])
    again = r.new_state(None)
    assert again.row == held[0].row
    with pytest.raises(ValueError, match="not a live codec state"):
        r.decode([held[0]], [codes_for(1, 0)])                       # released
    with pytest.raises(ValueError, match="twice"):
        r.decode([again, again], [codes_for(1, 0), codes_for(1, 0)])


def test_new_states_reset_reused_rows_in_one_pass(dec):
    """new_states: several rows (two with voice-clone prefixes, primed in one batch) reset together, in rows that
    earlier streams left dirty, decode exactly as fresh single new_state rows do; asking for more rows than are
    free takes none."""
    r = runner(dec, max_rows=3)
    dirty = [r.new_state(None) for _ in range(3)]
    r.decode(dirty, [codes_for(7, seed=i) for i in range(3)])
    for h in dirty:
        r.release(h)
    prefix, other, codes = codes_for(6, seed=9), codes_for(6, seed=8), [codes_for(12, seed=10 + i) for i in range(3)]
    prefixes = [other, prefix, None]
    shapes = record_steps(r)
    states = r.new_states(prefixes)
    assert shapes == [(2, 5), (2, 1)]                # both 6-frame references primed together: 5 + 1, batch 2
    assert sorted(s.row for s in states) == [0, 1, 2] and r.pool.num_free == 0
    got, _ = r.decode(states, codes)
    fresh = runner(dec, max_rows=3)
    for i, p in enumerate(prefixes):
        want, _ = fresh.decode([fresh.new_state(p)], [codes[i]])
        assert np.abs(got[i] - want[0]).max() <= TOL, i          # batch of 3 vs 1: rounding only
    for s in states:
        r.release(s)
    held = r.new_state(None)
    with pytest.raises(CodecPoolFullError, match="for 3 new stream"):
        r.new_states([None, None, None])
    assert r.pool.num_free == 2                      # all or none
    r.release(held)


def test_decode_async_on_cpu_equals_decode(dec):
    codes = [codes_for(n, seed=10 + n) for n in (5, 5, 3, 0)]
    outs = []
    for use_async in (False, True):
        r = runner(dec, max_rows=4)
        states = [r.new_state(None) for _ in codes]
        if use_async:
            # a request's frames may also come as the pieces they were made in
            frames = [codes[0], [codes[1][:1], codes[1][1:4], codes[1][4:]], codes[2], []]
            pending = r.decode_async(states, frames, final=[False, True, True, False])
            assert pending.ready()
            outs.append(pending.result())
            assert pending.result() is outs[-1]                      # result() is idempotent
        else:
            outs.append(r.decode(states, codes, final=[False, True, True, False])[0])
    assert [p.shape for p in outs[1]] == [(5 * UP,), (5 * UP,), (3 * UP,), (0,)]
    assert all(np.array_equal(x, y) for x, y in zip(*outs))


def test_warmup_touches_only_the_scratch_row(dec):
    r = runner(dec, max_rows=3)
    s = r.new_state(codes_for(4, seed=5))
    before = r.pool.read(s.row)
    seconds = r.warmup([1, 3], [1, 2, 25])
    assert isinstance(seconds, float) and seconds >= 0
    after = r.pool.read(s.row)
    assert all(torch.equal(before.tensors[k], v) for k, v in after.tensors.items())


def test_engine_loader_sizes_the_pool_and_casts_only_the_decoder():
    from voxflow.models.qwen3_tts.engine_loader import load
    plugin, codec = load(os.path.join(TINY, "custom_voice"), max_slots=3, codec_dtype="bfloat16")
    assert codec.pool.max_rows == 3 and plugin.max_slots == 3
    assert codec.dtype == torch.bfloat16 and codec.pool.state.tensors["pre_conv"].dtype == torch.bfloat16
    assert next(plugin.model.talker.parameters()).dtype == torch.float32
    # bf16 streamed vs fp32 one pass: audibly the same signal, not bit-equal (tools/codec_snr measures this)
    codes = codes_for(12, seed=9)
    s = codec.new_state(None)
    (pcm,), _ = codec.decode([s], [codes], final=[True])
    ref = one_pass(load_codec_decoder(os.path.join(TINY, "custom_voice")), codes)
    assert 15 < snr_db(ref, pcm) < 80
    with pytest.raises(ValueError, match="codec_dtype"):
        load(os.path.join(TINY, "custom_voice"), codec_dtype="bf16")


def test_codec_max_batch_splits_big_groups_without_changing_audio():
    from voxflow.models.qwen3_tts.engine_loader import load
    _, codec = load(os.path.join(TINY, "custom_voice"), max_slots=8, codec_max_batch=3)
    assert codec.batch_buckets == (1, 2, 3)
    dec = load_codec_decoder(os.path.join(TINY, "custom_voice"))
    codes = [codes_for(6, seed=20 + i) for i in range(5)]
    states = [codec.new_state(None) for _ in codes]
    pcm, _ = codec.decode(states, codes, final=[True] * 5)             # one group of 5 -> calls of 3 and 2
    for c, p in zip(codes, pcm):
        assert np.abs(one_pass(dec, c) - p).max() <= 1e-5
    with pytest.raises(ValueError, match="codec_max_batch"):
        load(os.path.join(TINY, "custom_voice"), codec_max_batch=0)


def test_packed_rows_gather_and_write_touch_only_the_given_rows():
    """PackedRows (the pool's storage): every row starts as the template's; the named tensors are views into one
    flat buffer per dtype; gather returns copies of the asked rows in the asked order; write puts each named tensor
    into its rows and leaves the others; a state with other names, shapes or dtypes is refused before anything is
    written (a same-size piece of another shape would otherwise land scrambled)."""
    from voxflow.models.qwen3_tts.codec_pool import PackedRows
    g = torch.Generator().manual_seed(0)
    template = {"a": torch.randn(1, 3, 2, generator=g), "pos": torch.tensor([4]), "b": torch.randn(1, 4, generator=g)}
    packed = PackedRows(template, 5)
    assert set(packed.flat) == {torch.float32, torch.int64} and packed.flat[torch.float32].shape == (5, 10)
    for name, t in template.items():
        assert torch.equal(packed.tensors[name], t.expand(5, *t.shape[1:]))
        assert packed.tensors[name].untyped_storage().data_ptr() == packed.flat[t.dtype].untyped_storage().data_ptr()
    src = {"a": torch.randn(5, 3, 2, generator=g), "pos": torch.arange(5), "b": torch.randn(5, 4, generator=g)}
    packed.write(torch.arange(5), src)
    rows = torch.tensor([3, 0])
    got = packed.gather(rows)
    assert all(torch.equal(got[n], src[n][rows]) for n in src)
    got["a"].zero_()                                         # a copy: the pool is untouched
    assert torch.equal(packed.tensors["a"], src["a"])
    new = {"a": torch.randn(2, 2, 3, generator=g).transpose(1, 2), "pos": torch.tensor([7, 8]),
           "b": torch.randn(2, 8, generator=g)[:, ::2]}      # strided pieces, as a decoder's slices may be
    assert not new["a"].is_contiguous() and not new["b"].is_contiguous()
    packed.write(rows, new)
    want = {n: src[n].clone() for n in src}
    for n in want:
        want[n][rows] = new[n]
    assert all(torch.equal(packed.tensors[n], want[n]) for n in src)
    for bad in ({"a": new["a"], "pos": new["pos"]},                                  # a name missing
                {**new, "a": torch.randn(2, 2, 3, generator=g)},                      # same size, other shape
                {**new, "b": new["b"].to(torch.float64)}):                            # other dtype
        with pytest.raises(ValueError, match="state"):
            packed.write(rows, bad)
        assert all(torch.equal(packed.tensors[n], want[n]) for n in src)
    with pytest.raises(ValueError, match="at least one"):
        PackedRows({}, 3)


def test_pool_state_is_packed_so_a_step_gathers_once_per_dtype(dec, monkeypatch):
    """The pool's step gathers its rows with one index_select per dtype (two: the float states and the frame
    counter) instead of one per state tensor (~38)."""
    r = runner(dec, max_rows=3)
    s = r.new_state(None)
    calls, inside = [], [False]            # counted while the pool gathers its rows (not the frames' own gather)
    real, gather = torch.Tensor.index_select, r.pool._packed.gather
    monkeypatch.setattr(torch.Tensor, "index_select",
                        lambda t, *a: (calls.append(t.shape) if inside[0] else None, real(t, *a))[1])

    def gathering(rows):
        inside[0] = True
        try:
            return gather(rows)
        finally:
            inside[0] = False
    monkeypatch.setattr(r.pool._packed, "gather", gathering)
    r.decode([s], [codes_for(2, 0)])
    assert len(r.pool.state.tensors) > 10 and len(calls) == 2, calls


@pytest.mark.parametrize("writer", [True, False])
def test_a_step_writes_the_new_state_straight_into_the_write_back_rows(dec, monkeypatch, writer):
    """The pool's step hands the decode a StateWriter: every state entry the decode updates is written into its
    piece of the packed write-back buffer (only the sub-pixel form's input rows, which the plain path never
    updates, are copied over from the old state), nothing packs the state with a cat, and the rows then hold
    exactly what a plain stream_decode of the same frames leaves (other rows untouched). With the switch off
    (VOXFLOW_CODEC_STATE_WRITER=0) the state is packed by a cat instead: the same rows."""
    from voxflow.models.qwen3_tts import codec_pool
    monkeypatch.setattr(codec_pool, "STATE_WRITER", writer)
    from voxflow.models.qwen3_tts.codec_decoder_blocks import CausalConvTranspose1d, StateWriter
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state, stream_decode
    r = runner(dec, max_rows=3)
    pool = r.pool
    handles = pool.allocate_many(2)
    rows = torch.tensor([h.row for h in handles])
    codes = [codes_for(3, 1).T[None], codes_for(3, 2).T[None]]
    writers, packs = [], []
    real_decode = codec_pool.stream_decode
    monkeypatch.setattr(codec_pool, "stream_decode",       # the new state it returns: the writer the decode used
                        lambda d, c, st: (lambda out: (writers.append(out[1].tensors), out)[1])(real_decode(d, c, st)))
    pack, empty = pool._packed.pack, pool._packed.empty
    monkeypatch.setattr(pool._packed, "pack", lambda *a: packs.append(1) or pack(*a))
    monkeypatch.setattr(pool._packed, "empty", lambda n: {dt: buf.fill_(float("nan") if dt.is_floating_point else -1)
                                                          for dt, buf in empty(n).items()})   # garbage, for sure
    untouched = pool.read(2).tensors
    with torch.no_grad():
        pool.step(rows, torch.cat(codes))                       # two calls: the second starts from a used state
        wav = pool.step(rows, torch.cat([codes_for(2, 3).T[None], codes_for(2, 4).T[None]]))
        plain = init_stream_state(dec, 2)
        _, plain = stream_decode(dec, torch.cat(codes), plain)
        want_wav, plain = stream_decode(dec, torch.cat([codes_for(2, 3).T[None], codes_for(2, 4).T[None]]), plain)
    assert len(writers) == 2 and all(isinstance(w, StateWriter) == writer for w in writers)
    assert len(packs) == (0 if writer else 2)
    other_form = {m.x_state_key for m in dec.modules() if isinstance(m, CausalConvTranspose1d) and m.subpixel}
    assert other_form and (not writer or writers[1].written == set(plain.tensors) - other_form)
    assert torch.equal(wav, want_wav[:, 0].float())
    for i, row in enumerate(rows.tolist()):
        got = pool.read(row).tensors
        assert all(torch.equal(got[k], plain.tensors[k][i:i + 1]) for k in plain.tensors), row
    assert all(torch.equal(pool.read(2).tensors[k], untouched[k]) for k in untouched)


def test_a_state_writer_knows_which_slots_hold_the_new_values():
    """StateWriter: reads give the old state until a key's slot is claimed (slot / keep), then the slot; a value
    assigned past them un-marks the key, so the write-back copies that value into its slot instead of trusting a
    stale one; the write-back refuses a state with other names than its layout's."""
    from voxflow.models.qwen3_tts.codec_decoder_blocks import StateWriter, keep
    from voxflow.models.qwen3_tts.codec_pool import PackedRows
    template = {"a": torch.zeros(1, 3), "b": torch.zeros(1, 2)}
    packed = PackedRows(template, 3)
    flat = packed.empty(2)
    old = {"a": torch.ones(2, 3), "b": torch.full((2, 2), 2.0)}
    w = StateWriter(old, packed.views(flat))
    assert w["a"] is old["a"]
    keep(w, "a", torch.full((2, 3), 5.0))
    assert w.written == {"a"} and w["a"] is w.slots["a"] and (w.slots["a"] == 5).all()
    keep(w, "b", torch.full((2, 2), 6.0))
    w["b"] = torch.full((2, 2), 7.0)                     # assigned past keep: not in its slot
    assert w.written == {"a"}
    rows = torch.tensor([2, 0])
    packed.write_slots(rows, flat, w)
    assert (packed.tensors["a"][rows] == 5).all() and (packed.tensors["b"][rows] == 7).all()
    assert (packed.tensors["a"][1] == 0).all()
    with pytest.raises(ValueError, match="names"):
        packed.write_slots(rows, flat, StateWriter({"a": old["a"]}, packed.views(flat)))


def test_nan_audio_is_zeroed_counted_and_logged(dec, caplog):
    """A decode that yields NaN (as an overflowing half-precision decoder would; here the output conv's bias is
    NaN) reaches the caller zeroed, not as NaN (which 16-bit PCM would turn into full-scale noise), flagged per
    request (the engine ends those requests: test_engine.py); the runner counts the chunks (the engine's stats and
    /metrics read it) and warns once; a healthy decode counts none."""
    import copy
    import logging
    from voxflow.models.qwen3_tts.codec_runner import zero_nonfinite
    bad = copy.deepcopy(dec)
    with torch.no_grad():
        bad.decoder[-1].conv.bias.fill_(float("nan"))
    runner = Qwen3CodecRunner.from_decoder(bad, max_rows=2)
    states = [runner.new_state(None) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="voxflow.codec"):
        pending = runner.decode_async(states, [codes_for(3, seed=1), codes_for(2, seed=2)], final=[True, True])
        out = pending.result()
        runner.decode(states[:1], [codes_for(1, seed=3)], final=[True])
    assert [p.shape for p in out] == [(3 * UP,), (2 * UP,)] and not any(p.any() for p in out)
    assert pending.nonfinite == [True, True]                   # which requests the engine must end
    assert runner.nonfinite_chunks == 3 and caplog.text.count("decoded NaN samples") == 1
    healthy = Qwen3CodecRunner.from_decoder(dec, max_rows=1)
    (pcm,), _ = healthy.decode([healthy.new_state(None)], [codes_for(3, seed=1)], final=[True])
    assert healthy.nonfinite_chunks == 0 and np.isfinite(pcm).all() and pcm.std() > 0
    x = np.array([0.5, np.nan, -0.25], dtype=np.float32)
    assert zero_nonfinite(x) and x.tolist() == [0.5, 0.0, -0.25] and not zero_nonfinite(x)


def test_warmup_prepares_the_largest_shape_first(dec):
    """warmup's shapes, in the order it runs them: every (batch bucket, piece) the sizes need, most frames decoded
    first (the graphs share one memory pool, which a larger capture after smaller ones fragments: codec_runner's
    warmup_shapes). The eager CPU path runs the same order."""
    r = runner(dec, max_rows=8)
    shapes = r.warmup_shapes([1, 3, 8], [1, 2, 5, 10, 25])
    assert set(shapes) == {(b, m) for b in (1, 4, 8) for m in (1, 2, 5, 10, 25)}
    assert shapes[0] == (8, 25) and shapes[-1] == (1, 1)
    work = [b * m for b, m in shapes]
    assert work == sorted(work, reverse=True)
    assert shapes.index((8, 5)) < shapes.index((4, 10)) and shapes.index((8, 1)) < shapes.index((4, 2))  # ties
    ran = []
    step = r.pool.step
    r.pool.step = lambda rows, codes: (ran.append((rows.shape[0], codes.shape[-1])), step(rows, codes))[1]
    r.warmup([1, 3, 8], [1, 2, 5, 10, 25])
    assert ran == shapes
