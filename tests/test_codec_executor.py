"""The codec stage's launch policy (voxflow/engine/codec_executor.py) against a fake codec that records its calls:
least audio sent first, a per-launch frame budget for regular chunks that never holds back first or final chunks,
and every frame decoded exactly once, in order, whatever the budget."""
import numpy as np
import pytest
import torch

from voxflow.engine.codec_executor import CodecExecutor


class RecordingCodec:
    """decode(): PCM = the frames' first codes as float32, one sample per frame; remembers each call's requests."""
    sample_rate = 1
    samples_per_frame = 1

    def __init__(self):
        self.calls: list[list[tuple[int, int]]] = []          # per call: (stream id, frames)

    def new_state(self, prefix_frames):
        return object()

    def decode(self, states, frames):
        self.calls.append([(int(f[0, 0]) // 1000, f.shape[0]) for f in frames])       # the stream, from its codes
        return [f[:, 0].float().numpy() for f in frames], states


def frames_of(stream: int, start: int, n: int) -> torch.Tensor:
    codes = torch.zeros(n, 16, dtype=torch.long)
    codes[:, 0] = stream * 1000 + torch.arange(start, start + n)
    return codes


def run(budget, steps=80, streams=8, codec=None, by_rows=False):
    """by_rows: each step's frames pushed as the rows of one [streams, 16] tensor (push_rows, as the engine does),
    else one tensor per stream (push)."""
    codec = codec or RecordingCodec()
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True, max_frames_per_launch=budget)
    made = {i: 0 for i in range(streams)}
    pcm = {i: [] for i in range(streams)}
    launches = []
    for step in range(steps):
        rows, owners = [], []
        for i in range(streams):
            if step == 0:
                ex.add(str(i), stream=True, initial_frames=2, chunk_frames=None, num_active=streams)
            owners.append(str(i) if str(i) in ex.streams and made[i] < 60 else None)
            rows.append(frames_of(i, made[i], 1))
            if owners[-1] is not None and not by_rows:
                ex.push(str(i), rows[-1])
        if by_rows:
            ex.push_rows(torch.cat(rows), owners)
        for i, owner in enumerate(owners):
            if owner is not None:
                made[i] += 1
                if made[i] == 60:
                    ex.finish(owner)
        before = len(codec.calls)
        ex.launch()
        launches.append(codec.calls[before:])
        for dc in ex.collect(block=True):
            pcm[int(dc.request_id)].append(dc.pcm)
    return codec, launches, pcm


@pytest.mark.parametrize("by_rows", [False, True])
def test_every_frame_is_decoded_once_in_order_whatever_the_budget(by_rows):
    for budget in (None, 60, 1):
        _, _, pcm = run(budget, by_rows=by_rows)
        for i, chunks in pcm.items():
            got = np.concatenate(chunks)
            assert np.array_equal(got, i * 1000 + np.arange(60, dtype=np.float32)), (budget, i)


def test_pushed_blocks_split_across_chunks_keep_every_frame_once_in_order():
    """Blocks of 7 frames into chunks of 5 (a block's rest stays pending for the next chunk), rows of steps in
    between; an async codec gets them as rows of their sources."""
    codec = AsyncRecordingCodec()
    ex = CodecExecutor(codec, chunk_frames=5, ramp=False)
    ex.add("a", stream=True, initial_frames=5, chunk_frames=5, num_active=2)
    ex.add("b", stream=True, initial_frames=5, chunk_frames=5, num_active=2)
    made, pcm = 0, {"a": [], "b": []}
    for k in range(6):
        ex.push("a", frames_of(0, made, 7))
        ex.push_rows(torch.cat([frames_of(9, 0, 1), frames_of(0, made + 7, 1), frames_of(1, k, 1)]),
                     [None, "a", "b"])
        made += 8
        ex.launch()                                     # a chunk of 5 per stream and launch
        for dc in ex.collect(block=True):
            pcm[dc.request_id].append(dc.pcm)
    assert ex.streams["a"].num_pending == 48 - 30 and ex.streams["b"].num_pending == 6 - 5
    ex.finish("a")
    ex.finish("b")
    ex.launch()                                         # the final chunks: what is left
    for dc in ex.collect(block=True):
        pcm[dc.request_id].append(dc.pcm)
    assert [len(c) for c in pcm["a"]] == [5] * 6 + [18]
    assert np.array_equal(np.concatenate(pcm["a"]), np.arange(48, dtype=np.float32))
    assert np.array_equal(np.concatenate(pcm["b"]), 1000 + np.arange(6, dtype=np.float32))


def test_a_burst_of_aligned_chunks_is_spread_and_first_chunks_never_wait():
    _, unlimited, _ = run(None)
    _, limited, _ = run(60)
    frames = lambda launch: sum(n for call in launch for _, n in call)          # noqa: E731
    assert max(frames(x) for x in unlimited) >= 8 * 25 - 8     # streams that start together hit 25 together
    # with the budget, a launch holds at most the budget plus one chunk that started below it (and finals)
    assert max(frames(x) for x in limited[:40]) <= 60 + 25
    # the first chunks of all 8 streams go in their first launch
    first = limited[1]
    assert sorted(sid for call in first for sid, n in call if n == 2) == list(range(8))


def test_least_audio_sent_goes_first():
    # within one launch, calls (one per chunk size) come in order of the audio their streams have sent
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25, max_frames_per_launch=None)
    ex.add("old", stream=True, initial_frames=1, chunk_frames=5, num_active=2)
    ex.add("new", stream=True, initial_frames=2, chunk_frames=None, num_active=2)
    ex.streams["old"].frames_done, ex.streams["old"].chunks_done = 40, 8
    ex.push("old", frames_of(0, 40, 5))
    ex.push("new", frames_of(1, 0, 2))
    ex.launch()
    assert [n for call in ex.codec.calls for _, n in call] == [2, 5]      # the new stream's first chunk first


def test_first_and_final_chunks_do_not_use_up_the_budget_of_regular_ones():
    """A big non-streaming request finishing every launch (its one final chunk) neither holds back a streaming
    request's regular chunk nor goes ahead of a new stream's first chunk."""
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25, max_frames_per_launch=100)
    ex.add("1", stream=True, initial_frames=1, chunk_frames=25, num_active=2)
    ex.streams["1"].chunks_done, ex.streams["1"].frames_done = 3, 60        # mid-stream: regular chunks of 25
    held = 0
    for k in range(10):
        big = f"{100 + k}"
        ex.add(big, stream=False, initial_frames=None, chunk_frames=None, num_active=2)
        ex.push(big, frames_of(100 + k, 0, 450))
        ex.finish(big)
        ex.push("1", frames_of(1, 60 + 25 * k, 25))
        if k == 5:
            ex.add("2", stream=True, initial_frames=2, chunk_frames=None, num_active=3)
            ex.push("2", frames_of(2, 0, 2))
        before = len(ex.codec.calls)
        ex.launch()
        calls = ex.codec.calls[before:]
        streams = [sid for call in calls for sid, _ in call]
        held += 1 not in streams
        if k == 5:
            assert streams[0] == 2                               # the new stream's first chunk leads the launch
        ex.collect(block=True)
    assert held == 0 and ex.streams["1"].num_pending == 0


def test_two_launches_of_one_round_share_the_budget():
    """An engine step launches twice (chunks of the frames read so far, then those the queued step completes):
    with same_round the second launch spends what is left of the first's budget, and a new round starts afresh.
    Four streams with a regular chunk of 25 due each, a budget of 30: a round sends two (the second starts with 5
    left), however the chunks fall between its launches."""
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25, max_frames_per_launch=30)
    for i in range(4):
        ex.add(str(i), stream=True, initial_frames=1, chunk_frames=25, num_active=4)
        ex.streams[str(i)].chunks_done, ex.streams[str(i)].frames_done = 2, 50
    for i in range(2):
        ex.push(str(i), frames_of(i, 50, 25))
    assert ex.launch() == 2                               # 25 spent, 5 left: one more still goes
    for i in range(2, 4):
        ex.push(str(i), frames_of(i, 50, 25))
    assert ex.launch(same_round=True) == 0                # the round's budget is spent
    assert ex.launch() == 2                               # a new round: the two held back


def test_a_launch_may_look_at_named_requests_only():
    """only: the engine's second launch of a step looks at the requests its queued step gave frames to (None rows
    skipped); a due chunk of any other request waits for a launch that looks at it."""
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25)
    for i in range(2):
        ex.add(str(i), stream=True, initial_frames=2, chunk_frames=None, num_active=2)
        ex.push(str(i), frames_of(i, 0, 2))
    assert ex.launch(only=[None, "1"]) == 1 and [sid for call in ex.codec.calls for sid, _ in call] == [1]
    assert ex.launch() == 1 and ex.codec.calls[-1] == [(0, 2)]


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError, match="max_frames_per_launch must be >= 1"):
        CodecExecutor(RecordingCodec(), max_frames_per_launch=0)


class AsyncRecordingCodec(RecordingCodec):
    """With decode_async and new_states (as the Qwen3 codec runner): remembers the `after` each call got."""

    def __init__(self):
        super().__init__()
        self.afters: list[tuple[str, object]] = []

    def new_state(self, prefix_frames, after=None):
        self.afters.append(("new_state", after))
        return object()

    def new_states(self, prefixes, after=None):
        self.afters.append(("new_states", after))
        return [object() for _ in prefixes]

    def decode_async(self, states, frames, final=None, after=None):
        self.afters.append(("decode_async", after))
        pcm, _ = self.decode(states, frames.tensors())
        return type("Done", (), {"ready": lambda self: True, "result": lambda self: pcm})()


def test_new_codec_states_wait_only_for_the_frames_event():
    """A burst of first chunks resets its codec states after the same event as their frames' decode, not after all
    the talker work queued so far (which includes the decode the engine has just launched: a step of delay)."""
    codec = AsyncRecordingCodec()
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True, max_frames_per_launch=None)
    for i in range(3):
        ex.add(str(i), stream=True, initial_frames=1, chunk_frames=None, num_active=3)
        ex.push(str(i), frames_of(i, 0, 1))
    event = object()
    assert ex.launch(after=event) == 3
    assert codec.afters == [("new_states", event), ("decode_async", event)]
    ex.add("late", stream=True, initial_frames=1, chunk_frames=None, num_active=4)
    ex.push("late", frames_of(7, 0, 1))
    ex.launch(after=None)                       # no event: the codec's default ordering, no `after` passed
    assert codec.afters[-2:] == [("new_state", None), ("decode_async", None)]


def test_engine_chosen_first_chunk_grows_with_load_but_stays_short():
    """initial_frames_for_load: one frame when idle, never fewer as the load grows, and at most 5 frames (0.4 s of
    audio) however many streams run: on the H200 a 10-frame first chunk at 64 streams put ~100 ms of waiting into
    every first packet (TTFP p99 336 vs 189 ms with 5)."""
    from voxflow.engine.codec_executor import initial_frames_for_load
    sizes = [initial_frames_for_load(n) for n in range(1, 513)]
    assert sizes[0] == 1
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    assert max(sizes) == 5
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25, ramp=True)
    ex.add("busy", stream=True, initial_frames=None, chunk_frames=None, num_active=64)
    assert ex.streams["busy"].initial_frames == 5


def one_stream_chunks(ex, frames: int) -> list[int]:
    """Stream "0" gets one frame a step, `frames` in all, the last with its finish; each step launches what is due and
    collects it. Returns its chunk sizes, having checked that the chunks hold every frame once, in order."""
    pcm = []
    for made in range(frames):
        ex.push("0", frames_of(0, made, 1))
        if made == frames - 1:
            ex.finish("0")
        ex.launch()
        pcm += [dc.pcm for dc in ex.collect(block=True)]
    assert np.array_equal(np.concatenate(pcm), np.arange(frames, dtype=np.float32))
    return [len(p) for p in pcm]


@pytest.mark.parametrize("sizes, want", [
    ((), [1, 1, 2, 4, 8, 16, 25, 25, 25, 25, 19]),                    # no sizes given: the doubling ramp
    ((1, 2, 5, 10, 25), [1, 1, 2, 2, 5, 10, 10, 25, 25, 25, 25, 20]),  # the Qwen3 codec's frame buckets
])
def test_the_ramp_rounds_growing_chunks_down_to_the_codecs_one_pass_sizes(sizes, want):
    """A growing chunk is at most the audio already sent, rounded down to a size the codec decodes in one pass
    (`chunk_sizes`); regular (25) and final chunks are not rounded; every frame is decoded once, in order."""
    codec = RecordingCodec()
    codec.chunk_sizes = sizes
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True)
    ex.add("0", stream=True, initial_frames=1, chunk_frames=None, num_active=1)
    assert one_stream_chunks(ex, 151) == want


@pytest.mark.parametrize("total, eos_at, want", [
    (151, None, [1, 1, 2, 2, 5, 10, 10, 25, 25, 25, 25, 5, 5, 5, 5]),     # tail: the last 20 as 5, 5, 5 + final 5
    (153, None, [1, 1, 2, 2, 5, 10, 10, 25, 25, 25, 25, 5, 5, 5, 5, 2]),  # ... the last 22: final 2
    (151, 140, [1, 1, 2, 2, 5, 10, 10, 25, 25, 25, 25, 5, 4]),            # an EOS first: the rest at its finish
    (8, None, [1, 1, 2, 2, 2]),                                           # shorter than one regular chunk
])
def test_a_length_limited_streams_last_frames_go_in_tail_chunks(total, eos_at, want):
    """tail_chunk: once a stream's frames still to go (to its length limit) fit in one regular chunk, they go in
    tail_chunk pieces as they come, the last piece (1..tail_chunk frames, with the last frame) at the finish; an
    EOS before the limit sends what is pending then. Every frame once, in order."""
    codec = RecordingCodec()
    codec.chunk_sizes = (1, 2, 5, 10, 25)
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True, tail_chunk=5)
    ex.add("0", stream=True, initial_frames=1, chunk_frames=None, num_active=1, total_frames=total)
    assert one_stream_chunks(ex, total if eos_at is None else eos_at) == want


@pytest.mark.parametrize("factor, tail, want", [
    (1.0, 5, [5, 5, 10, 10, 25, 25, 25, 25, 5, 5, 5, 5]),     # the default: at most the audio already sent
    (2.0, 10, [5, 10, 25, 25, 25, 25, 25, 10]),               # at most twice it: 8 codec calls a request, not 12
    (1.5, 5, [5, 5, 10, 25, 25, 25, 25, 25, 5]),              # (7.5 -> 5, 15 -> 10: rounded down to a one-pass size)
])
def test_a_ramp_factor_lets_growing_chunks_reach_that_multiple_of_the_audio_sent(factor, tail, want):
    """ramp_factor: each growing chunk is at most factor x the audio already sent (rounded down to a one-pass size),
    so a busy engine's streams reach their regular chunks in fewer, larger codec calls; every frame once, in order."""
    codec = RecordingCodec()
    codec.chunk_sizes = (1, 2, 5, 10, 25)
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True, tail_chunk=tail, ramp_factor=factor)
    ex.add("0", stream=True, initial_frames=None, chunk_frames=None, num_active=64, total_frames=150)
    assert one_stream_chunks(ex, 150) == want


@pytest.mark.parametrize("factor", [0.5, 0.0, -1.0, float("nan")])
def test_a_ramp_factor_below_one_is_refused(factor):
    with pytest.raises(ValueError, match="ramp_factor"):
        CodecExecutor(RecordingCodec(), ramp_factor=factor)


def test_tail_chunks_are_off_by_default_and_must_not_be_negative():
    ex = CodecExecutor(RecordingCodec(), chunk_frames=25, ramp=True)
    ex.add("0", stream=True, initial_frames=1, chunk_frames=None, num_active=1, total_frames=151)
    assert ex.streams["0"].tail_chunk == 0
    with pytest.raises(ValueError, match="tail_chunk"):
        CodecExecutor(RecordingCodec(), tail_chunk=-1)


class LaggingCodec(RecordingCodec):
    """decode_async whose calls land only when waited for (result()) or when `land()` says so, as a GPU codec's
    calls land some time after their launch."""

    def __init__(self):
        super().__init__()
        self.pendings = []
        self.waited: list[int] = []         # calls (by launch index) whose result() was asked for

    def decode_async(self, states, frames, final=None, after=None):
        pcm, _ = self.decode(states, frames.tensors())
        codec = self

        class Lagging:
            landed = False

            def ready(self):
                return self.landed

            def result(self):
                codec.waited.append(codec.pendings.index(self))
                return pcm
        pending = Lagging()
        self.pendings.append(pending)
        return pending

    def land(self, i):
        self.pendings[i].landed = True


def test_call_rows_cuts_chunks_due_together_into_calls_of_that_many_requests():
    """call_rows: five streams' first chunks (due together, one size) go in calls of at most 2 requests, in the
    launch order (least audio first), every frame once; with no limit they share one call."""
    for call_rows, want in ((2, [2, 2, 1]), (None, [5]), (5, [5]), (1, [1, 1, 1, 1, 1])):
        codec = RecordingCodec()
        ex = CodecExecutor(codec, chunk_frames=25, ramp=True, call_rows=call_rows)
        for i in range(5):
            ex.add(str(i), stream=True, initial_frames=2, chunk_frames=None, num_active=5)
            ex.push(str(i), frames_of(i, 0, 2))
        assert ex.launch() == 5
        assert [len(call) for call in codec.calls] == want, call_rows
        assert [s for call in codec.calls for s, _ in call] == list(range(5))       # the launch order, kept
        assert all(n == 2 for call in codec.calls for _, n in call)
        got = {dc.request_id: dc.pcm for dc in ex.collect(block=True)}
        assert all(np.array_equal(got[str(i)], i * 1000 + np.arange(2, dtype=np.float32)) for i in range(5))
    with pytest.raises(ValueError, match="call_rows"):
        CodecExecutor(RecordingCodec(), call_rows=0)


def test_collect_block_oldest_waits_for_the_oldest_call_only():
    """collect(block_oldest=True) waits for the oldest call (even if it has not landed) and takes the calls after
    it only as far as they have landed; block=True waits for all; a plain collect takes only landed calls."""
    codec = LaggingCodec()
    ex = CodecExecutor(codec, chunk_frames=25, ramp=True, call_rows=1)
    for i in range(4):
        ex.add(str(i), stream=True, initial_frames=1, chunk_frames=None, num_active=4)
        ex.push(str(i), frames_of(i, 0, 1))
        ex.finish(str(i))
    assert ex.launch() == 4 and ex.calls_in_flight == 4
    assert ex.collect() == []                                   # nothing landed yet
    codec.land(1)                                               # the second landed, the first not yet
    assert ex.collect() == []                                   # in launch order: behind the first
    got = ex.collect(block_oldest=True)
    assert [dc.request_id for dc in got] == ["0", "1"] and codec.waited == [0, 1]
    assert [ex.drained(str(i)) for i in range(4)] == [True, True, False, False]
    got = ex.collect(block_oldest=True)                         # the third, not yet landed: waited for; not the 4th
    assert [dc.request_id for dc in got] == ["2"] and ex.calls_in_flight == 1
    assert [dc.request_id for dc in ex.collect(block=True)] == ["3"] and not ex.busy


def test_first_chunks_wait_for_a_free_codec_state():
    """A codec with `free_states` (a fixed pool): first chunks past its free states wait for a later launch (frames
    pending, `row_starved` set for the round) instead of failing; regular chunks of streams that hold a state go
    on; once states are free the waiting first chunks go, every frame once."""
    codec = RecordingCodec()
    codec.free_states = 1
    ex = CodecExecutor(codec, chunk_frames=2, ramp=False)
    ex.add("old", stream=True, initial_frames=2, chunk_frames=2, num_active=3)
    ex.push("old", frames_of(9, 0, 2))
    assert ex.launch() == 1 and not ex.row_starved
    codec.free_states = 0                                       # "old" holds the only state
    for i in range(2):
        ex.add(str(i), stream=True, initial_frames=2, chunk_frames=2, num_active=3)
        ex.push(str(i), frames_of(i, 0, 2))
    ex.push("old", frames_of(9, 2, 2))
    assert ex.launch() == 1 and ex.row_starved                  # only old's regular chunk
    assert [s for call in codec.calls[1:] for s, _ in call] == [9]
    codec.free_states = 1
    assert ex.launch() == 1 and ex.row_starved                  # one of the two waiting first chunks
    codec.free_states = 5
    assert ex.launch() == 1 and not ex.row_starved              # the other
    got = {}
    for dc in ex.collect(block=True):
        got.setdefault(dc.request_id, []).append(dc.pcm)
    assert np.array_equal(np.concatenate(got["old"]), 9000 + np.arange(4, dtype=np.float32))
    assert all(np.array_equal(got[str(i)][0], i * 1000 + np.arange(2, dtype=np.float32)) for i in range(2))


def test_a_finished_stream_gets_a_free_codec_state_before_new_first_chunks():
    """With fewer free states than streams without one, a finished stream (here a non-streamed request whose only
    chunk is due) gets a state before streamed first chunks that are ahead of it in the launch order: its state
    comes back after that one call, a streamed request's only when it ends."""
    codec = RecordingCodec()
    codec.free_states = 1
    ex = CodecExecutor(codec, chunk_frames=2, ramp=False)
    ex.add("whole", stream=False, initial_frames=None, chunk_frames=None, num_active=3)
    ex.push("whole", frames_of(7, 0, 3))
    ex.finish("whole")
    for i in range(2):
        ex.add(str(i), stream=True, initial_frames=2, chunk_frames=2, num_active=3)
        ex.push(str(i), frames_of(i, 0, 2))
    assert ex.launch() == 1 and ex.row_starved
    assert codec.calls == [[(7, 3)]]
    codec.free_states = 2
    assert ex.launch() == 2 and not ex.row_starved
    assert sorted(s for call in codec.calls[1:] for s, _ in call) == [0, 1]
