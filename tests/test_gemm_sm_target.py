"""talker_gemm_sms: the talker step's busy-variant graphs (cuBLAS planned for the SMs the codec leaves).

On a CPU there are no graphs and no cuBLAS, so what is held here is everything around them: the setting's checks
and its SM arithmetic (against a faked GPU of 132 SMs), that the SM target is set for the capture and put back
after it (a faked cuBLAS handle), which graph key a step asks for, and which steps the engine marks busy (a codec
whose calls land late, as a GPU's do). tests/gpu holds the captured graphs to the CPU reference.
"""
from __future__ import annotations

import contextlib
import types

import pytest
import torch

from test_engine import _LandsLate, assert_all_released, assert_engine_matches_reference, greedy, make_engine
from voxflow.engine import gemm_sm_target as gst
from voxflow.engine.graph_runner import BUSY_MIN_BUCKET, BusyVariant, DecodeRunner

CUDA = torch.device("cuda")


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda as far as gemm_sm_target reads it: 132 SMs, one cuBLAS handle whose SM target is a number."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_blas_handle", lambda: 1234)
    handle = {"target": 0, "calls": []}

    def set_target(lib, h, n):
        assert h == 1234
        handle["calls"].append(n)
        handle["target"] = n
    monkeypatch.setattr(gst, "_cublas_library", lambda: object())
    monkeypatch.setattr(gst, "_handle_target", lambda lib, h: handle["target"])
    monkeypatch.setattr(gst, "_set_handle_target", set_target)
    saved = torch._C._get_sm_carveout_experimental()
    yield handle
    torch._C._set_sm_carveout_experimental(saved)


def test_the_setting_is_checked_and_rest_is_what_the_codec_leaves(fake_gpu):
    assert gst.busy_gemm_sms(None, CUDA, 64) is None
    assert gst.busy_gemm_sms("rest", CUDA, 64) == 68
    assert gst.busy_gemm_sms("rest", CUDA, 60) == 68          # the driver gives 60 asked as 64
    assert gst.busy_gemm_sms(96, CUDA, 64) == 96
    with pytest.raises(ValueError, match="SM partition"):
        gst.busy_gemm_sms("rest", CUDA, None)            # the codec on the whole GPU: no rest to plan for
    with pytest.raises(ValueError, match="1..132"):
        gst.busy_gemm_sms(200, CUDA, 64)
    for bad in (0, -3, True, "half", 1.5):
        with pytest.raises(ValueError, match="talker_gemm_sms"):
            gst.busy_gemm_sms(bad, CUDA, 64)
        with pytest.raises(ValueError, match="talker_gemm_sms"):
            gst.busy_gemm_sms(bad, torch.device("cpu"), None)     # a bad setting fails on a CPU too
    assert gst.busy_gemm_sms("rest", torch.device("cpu"), None) is None      # and a good one does nothing there


def test_the_target_is_set_inside_and_put_back_after_also_on_an_error(fake_gpu):
    torch._C._set_sm_carveout_experimental(None)
    fake_gpu["target"] = 7                                   # whatever the handle had before
    with gst.gemm_sm_target(68, CUDA):
        assert fake_gpu["target"] == 68
        assert torch._C._get_sm_carveout_experimental() == 132 - 68
    assert fake_gpu["target"] == 7 and torch._C._get_sm_carveout_experimental() is None
    with pytest.raises(RuntimeError, match="boom"), gst.gemm_sm_target(40, CUDA):
        raise RuntimeError("boom")
    assert fake_gpu["target"] == 7 and torch._C._get_sm_carveout_experimental() is None
    assert fake_gpu["calls"] == [68, 7, 40, 7]
    with pytest.raises(ValueError, match="1..132"), gst.gemm_sm_target(133, CUDA):
        pass
    assert fake_gpu["calls"] == [68, 7, 40, 7]               # a refused target touches nothing


def test_a_refused_handle_target_leaves_the_carveout_as_it_was(fake_gpu, monkeypatch):
    torch._C._set_sm_carveout_experimental(None)
    set_target = gst._set_handle_target

    def refuse_13(lib, h, n):
        if n == 13:
            raise RuntimeError("cublasSetSmCountTarget(13) failed (status 7)")
        set_target(lib, h, n)
    monkeypatch.setattr(gst, "_set_handle_target", refuse_13)
    with pytest.raises(RuntimeError, match="status 7"), gst.gemm_sm_target(13, CUDA):
        pytest.fail("the block must not run")
    assert torch._C._get_sm_carveout_experimental() is None and fake_gpu["target"] == 0


def test_with_prefer_lt_cublaslt_is_preferred_inside_only(fake_gpu, monkeypatch):
    """VOXFLOW_GEMM_SM_TARGET_LT's A/B: PyTorch prefers cuBLASLt inside the context and what it preferred before
    after it. (This CPU build refuses cuBLASLt: the setter is faked, the bookkeeping is what is held.)"""
    preferred = ["cublas"]

    def library(backend=None):
        if backend is not None:
            preferred.append(str(backend))
        return preferred[-1]
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    monkeypatch.setattr(gst, "PREFER_LT", True)
    with gst.gemm_sm_target(68, CUDA):
        assert library() == "cublaslt"
    assert library() == "cublas"
    monkeypatch.setattr(gst, "PREFER_LT", False)
    with gst.gemm_sm_target(68, CUDA):
        assert library() == "cublas"


def test_no_target_or_a_cpu_device_changes_nothing(monkeypatch):
    monkeypatch.setattr(gst, "_set_handle_target", lambda *a: pytest.fail("no handle call expected"))
    before = torch._C._get_sm_carveout_experimental()
    for target, device in ((None, CUDA), (64, torch.device("cpu"))):
        with gst.gemm_sm_target(target, device):
            assert torch._C._get_sm_carveout_experimental() == before


def _runner(busy_gemm_sms):
    model = types.SimpleNamespace(device="cpu", decode_variant=lambda: (True, False, 0, 0), padding_slot=0)
    return DecodeRunner(model, None, None, block_size=4, max_batch=64, max_width=8, scratch_block=0,
                        cuda_graphs=False, busy_gemm_sms=busy_gemm_sms)


def test_only_busy_steps_of_large_buckets_ask_for_the_busy_graph():
    runner = _runner(68)
    variant = (True, False, 0, 0)
    assert runner._key(BUSY_MIN_BUCKET, 8, 0, busy=True) == (BUSY_MIN_BUCKET, 8, variant, BusyVariant(68))
    assert runner._key(64, 8, 0, busy=True)[-1] == BusyVariant(68)
    assert runner._key(64, 8, 0, busy=False) == (64, 8, variant)
    small = max(b for b in runner.buckets if b < BUSY_MIN_BUCKET)
    assert runner._key(small, 8, 0, busy=True) == (small, 8, variant)      # skinny Triton GEMMs: no variant
    assert _runner(None)._key(64, 8, 0, busy=True) == (64, 8, variant)     # off: one graph per shape


@pytest.mark.parametrize("copies", [False, True])
def test_startup_captures_a_busy_graph_per_large_bucket_under_its_target_and_replays_it(copies, monkeypatch):
    """capture() with busy_gemm_sms: every bucket gets its plain graph, buckets >= BUSY_MIN_BUCKET a busy one too
    (with GRAPH_COPIES one per flip each), and only the busy captures run under the SM target; a busy step then
    replays its bucket's busy graph (last_busy), a plain step or a small bucket the plain one. (The capture itself
    is faked: a CPU has no CUDA graphs.)"""
    import voxflow.engine.graph_runner as gr
    targets = []

    @contextlib.contextmanager
    def recording_target(sms, device):
        targets.append(sms)
        yield
    replays = []
    fake_graph = types.SimpleNamespace(replay=lambda: replays.append(1))
    monkeypatch.setattr(gr, "gemm_sm_target", recording_target)
    monkeypatch.setattr(gr, "warm_then_capture", lambda run, pool, side: (fake_graph, "out"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    runner = _runner(68)
    runner.cuda_graphs, runner.graph_copies = True, copies
    runner._side = types.SimpleNamespace(synchronize=lambda: None)
    if copies:
        runner._host_flags = [torch.zeros(64, 2, dtype=torch.bool) for _ in range(2)]
    runner.capture(widths=[8])
    flips = 2 if copies else 1
    large = [b for b in runner.buckets if b >= BUSY_MIN_BUCKET]
    assert len(runner._graphs) == flips * (len(runner.buckets) + len(large))
    busy_keys = [k for k in runner._graphs if isinstance(k[-1], BusyVariant)]
    assert sorted({k[0] for k in busy_keys}) == large and all(k[-1].sms == 68 for k in busy_keys)
    assert sorted(t for t in targets if t is not None) == [68] * len(busy_keys)
    assert targets.count(None) == flips * len(runner.buckets)
    monkeypatch.setattr(runner, "_fill", lambda *a: None)
    monkeypatch.setattr(runner, "_copy_inputs", lambda *a: None)
    monkeypatch.setattr(gr, "DecodeOutput", lambda *a, **k: None)
    runner._graphs = {k: (fake_graph, types.SimpleNamespace(frames=[], finished=[], eos=[], flags=None))
                      for k in runner._graphs}
    for n, busy, want in ((20, True, True), (20, False, False), (4, True, False)):
        runner.run([0] * n, [[0] * 8] * n, [1] * n, [0] * n, busy=busy)        # tables 8 wide: the captured width
        assert runner.last_busy == want, (n, busy)
    assert len(replays) == 3 and len(runner._graphs) == flips * (len(runner.buckets) + len(large))    # no capture


class _LandsAfterSteps(_LandsLate):
    """A codec call's pending PCM that lands once the engine has run `steps` more steps (ready() has no side effect,
    so the engine's busy query and the test's own agree)."""

    def __init__(self, core, pending, steps: int):
        super().__init__(pending)
        self._core, self._at = core, core.steps + steps

    def ready(self):
        return self._core.steps >= self._at


def test_an_engine_marks_steps_beside_in_flight_codec_calls_busy_and_serves_the_reference(monkeypatch, tmp_path):
    """talker_gemm_sms="rest" on a CPU engine (given a GPU's SM target: a CPU has none): a step asks for the busy
    graph exactly when a codec call launched before it has not landed; the requests are served as the reference's,
    and everything is released. (A CPU runs no graphs: the trace's beside_codec, what was replayed, stays false.)"""
    trace = tmp_path / "steps.jsonl"
    core = make_engine(talker_gemm_sms="rest", trace_steps=str(trace))
    assert core.runner.busy_gemm_sms is None                 # a CPU: no graphs to plan
    core.runner.busy_gemm_sms = 68
    decode_async = core.codec.decode_async
    monkeypatch.setattr(core.codec, "decode_async", lambda *a, **k: _LandsAfterSteps(core, decode_async(*a, **k), 2))
    asked = []
    run = core.runner.run

    def spy(*a, busy=False, **k):
        launched = core.codec_exec._launched
        asked.append((busy, bool(launched) and not launched[-1][0].ready()))
        return run(*a, busy=busy, **k)
    monkeypatch.setattr(core.runner, "run", spy)
    reqs = [greedy(t, n, voice="vivian", request_id=str(i))
            for i, (t, n) in enumerate([("Hello world.", 11), ("A second one, a little longer.", 17)])]
    for r in reqs:
        core.add_request(r)
    results = {r.request_id: [] for r in reqs}
    while core.has_work():
        for o in core.step():
            results[o.request_id].append(o)
    assert all(busy == running for busy, running in asked)
    assert any(busy for busy, _ in asked) and not all(busy for busy, _ in asked)
    assert not any('"beside_codec": true' in line for line in trace.read_text().splitlines())
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    assert_all_released(core)


def test_all_steps_replay_the_variant_with_steps_all_and_bad_settings_stop_the_engine():
    core = make_engine(talker_gemm_sms=68, talker_gemm_sms_steps="all")
    assert core._codec_busy() and not core.codec_exec.running()
    assert not make_engine(talker_gemm_sms=68)._codec_busy()            # "busy", and nothing launched yet
    with pytest.raises(ValueError, match="talker_gemm_sms_steps"):
        make_engine(talker_gemm_sms="rest", talker_gemm_sms_steps="sometimes")
    with pytest.raises(ValueError, match="talker_gemm_sms"):
        make_engine(talker_gemm_sms="most")
