"""GPU checks (run on the device machine: `python -m pytest tests/gpu -q`); skipped where there is no CUDA.

The engine's batched paged path on the GPU must produce the codes of the eager fp32 CPU reference (greedy, first
30 frames) and audio within tolerance in fp32 (bf16 is a later step: it is measured against fp32 by SNR, not by equal codes).
"""
import os

import numpy as np
import pytest
import torch

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.offline import run_offline
from voxflow.engine.request import FinalRecord, SamplingOptions, SpeechRequest, StreamingOptions
from voxflow.engine.sm_partition import auto_sms
from voxflow.models.qwen3_tts.generate import SynthesisRequest, decode_to_wav, generate_codes, prepare
from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.sampling import RequestSampler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
# Plain fp32 on the GPU (cuDNN convolutions default to TF32, which is a speed choice measured elsewhere).
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
TEXTS = ["Hello world.", "The quick brown fox jumps over the lazy dog.", "Speak happily.", "This is a tiny test."]


def record_frames(core) -> dict:
    """{request id: [frame [1, 16], ...]}: every frame the core hands its codec, recorded as it goes."""
    frames: dict = {}
    push_rows = core.codec_exec.push_rows

    def recording_push_rows(step_frames, request_ids):
        for i, rid in enumerate(request_ids):
            if rid is not None:
                frames.setdefault(rid, []).append(step_frames[i:i + 1].clone())
        push_rows(step_frames, request_ids)
    core.codec_exec.push_rows = recording_push_rows
    return frames


def engine_codes(dtype: str, cuda_graphs: bool = True, kernels: bool = True, texts=TEXTS, sampling=None,
                 streaming=None, on_core=None, **config):
    """{request id: (codes, audio)} of the engine serving `texts`, greedy unless `sampling(i)` gives request i's
    options; not streamed unless `streaming` (StreamingOptions) says otherwise; on_core(core) before serving."""
    # the codec in fp32, not the GPU default ("auto": fp16 after its check), since the audio is held to the CPU
    # loop's within 1e-4
    config = dict(dict(max_num_seqs=8, num_kv_blocks=512, block_size=16, codec_dtype="float32"), **config)
    core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, "custom_voice"), device="cuda", dtype=dtype,
                                               cuda_graphs=cuda_graphs, kernels=kernels, **config))
    assert core.runner.cuda_graphs == cuda_graphs
    if config.get("talker_high_priority"):
        assert core._stream is not None and core._stream.priority < 0
    frames = record_frames(core)
    if on_core is not None:
        on_core(core)
    reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i),
                          streaming=streaming or StreamingOptions(stream=False),
                          sampling=sampling(i) if sampling else SamplingOptions(greedy=True, max_new_tokens=31))
            for i, t in enumerate(texts)]
    replays = core.prefill_runner.stats.replays if cuda_graphs else 0
    results = run_offline(core, reqs)
    if cuda_graphs:            # the prompts went through the prefill CUDA graphs (voxflow/engine/prefill_runner.py)
        assert core.prefill_runner.stats.replays > replays
    return {r.request.request_id: (torch.cat(frames[r.request.request_id]), r.audio()) for r in results}


def record_runs(monkeypatch, cls, name: str) -> list[bool]:
    """Wrap the method cls.name (one that returns None when it declines): the list gets, per call, whether it ran."""
    ran, real = [], getattr(cls, name)

    def spied(self, *a):
        out = real(self, *a)
        ran.append(out is not None)
        return out
    monkeypatch.setattr(cls, name, spied)
    return ran


def reference(text, max_new_tokens: int = 31):
    model = Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"))
    prompt, params, n, _ = prepare(model, SynthesisRequest(text=text, speaker="vivian", greedy=True,
                                                           max_new_tokens=max_new_tokens))
    codes, _, _, _ = generate_codes(model, prompt, RequestSampler(params), n)
    return codes, decode_to_wav(model, codes)


def served(reqs, outs, frames) -> dict:
    """{request id: (codes, audio)} from a served run's outputs by request (each ended without error) and the frames
    record_frames saw."""
    from voxflow.audio.io import pcm_from_bytes
    got = {}
    for r in reqs:
        chunks = sorted((o for o in outs[r.request_id] if hasattr(o, "pcm")), key=lambda c: c.index)
        assert outs[r.request_id][-1].error is None
        got[r.request_id] = (torch.cat(frames[r.request_id]), pcm_from_bytes(b"".join(c.pcm for c in chunks),
                                                                            r.pcm_format))
    return got


def assert_equals_reference(got, texts):
    """Each request's codes == the CPU loop's, its audio within 1e-4 (fp32)."""
    for i, text in enumerate(texts):
        codes, wav = reference(text)
        assert torch.equal(got[str(i)][0].cpu(), codes), f"codes differ for {text!r}"
        assert np.abs(got[str(i)][1] - wav).max() <= 1e-4


@pytest.mark.parametrize("cuda_graphs,kernels", [(False, False), (True, False), (True, True)],
                         ids=["eager", "graphs", "graphs+kernels"])
def test_gpu_fp32_engine_equals_cpu_reference(cuda_graphs, kernels):
    """Greedy codes of the GPU engine (eager, CUDA graphs, graphs + Triton kernels) == the eager fp32 CPU loop."""
    got = engine_codes("float32", cuda_graphs, kernels)
    for i, text in enumerate(TEXTS):
        codes, wav = reference(text)
        assert codes.shape[0] == 30
        assert torch.equal(got[str(i)][0].cpu(), codes), f"codes differ for {text!r}"
        assert np.abs(got[str(i)][1] - wav).max() <= 1e-4


class _ReadyLate:
    """A codec call's pending PCM that reports itself ready only from its `polls`-th query on (and then when its
    CUDA event says so): calls that land late, as under load, on the tiny model's quick codec."""

    def __init__(self, pending, polls: int):
        self._pending, self._polls = pending, polls

    def ready(self):
        self._polls -= 1
        return self._polls < 0 and self._pending.ready()

    def result(self):
        return self._pending.result()

    @property
    def nonfinite(self):
        return self._pending.nonfinite


def test_gpu_codec_calls_of_one_request_on_two_slots_equal_cpu_reference():
    """codec_call_rows=1, four streamed requests of different lengths on two slots, codec calls that land 8 polls
    late: chunks due together go in one codec call each, an idle engine waits for the codec's oldest call only, and
    a queued request's first chunk waits for a codec state that its slot's previous request still holds (its final
    chunk in flight on the codec's stream; seen at least once): the same greedy codes and audio as the CPU loop."""
    starved = []

    def lagging(core):
        decode_async, launch = core.codec.decode_async, core.codec_exec.launch
        core.codec.decode_async = lambda *a, **k: _ReadyLate(decode_async(*a, **k), 8)

        def spied_launch(*a, **k):
            n = launch(*a, **k)
            starved.append(core.codec_exec.row_starved)
            return n
        core.codec_exec.launch = spied_launch
    got = engine_codes("float32", texts=TEXTS, max_num_seqs=2, codec_call_rows=1, eager_first_chunk=0,
                       streaming=StreamingOptions(initial_chunk_frames=2, chunk_frames=5), on_core=lagging,
                       sampling=lambda i: SamplingOptions(greedy=True, max_new_tokens=(12, 31, 31, 31)[i]))
    assert any(starved)
    for i, text in enumerate(TEXTS):
        codes, wav = reference(text, (12, 31, 31, 31)[i])
        assert torch.equal(got[str(i)][0].cpu(), codes), f"codes differ for {text!r}"
        assert np.abs(got[str(i)][1] - wav).max() <= 1e-4


def test_gpu_engine_on_a_high_priority_stream_equals_cpu_reference():
    """talker_high_priority: the whole engine (allocations, captures, prompts, steps) on a highest-priority stream
    while the codec keeps its own: the same greedy codes and audio as the CPU loop (any missing ordering between
    the streams would show as wrong or stale frames)."""
    got = engine_codes("float32", texts=TEXTS, talker_high_priority=True)
    assert_equals_reference(got, TEXTS)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_gpu_packed_prefill_equals_cpu_reference(packed):
    """packed_prefill (engine/packed_prefill.py, the default): the four prompts end to end in one packed replay,
    attending by query tiles (kernels/paged_prefill_attention.py) after every row's K/V was written (a row reads its
    sequence's earlier rows: read before they are written, the codes would differ). Padded (packed_prefill=False,
    kernels still on): the per-prompt graphs of prefill_runner.py, the path that also runs where kernels are off."""
    got = engine_codes("float32", texts=TEXTS, packed_prefill=packed)
    assert_equals_reference(got, TEXTS)


def test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference(monkeypatch):
    """Twelve requests (decode bucket 16, above SKINNY_MAX_ROWS): the talker's and the code predictor's layers on
    cuBLAS-sized GEMMs with each residual add fused into the norm after it (Qwen3DecoderLayer.forward_deferred):
    the same codes and audio as the CPU loop. CP_JOINT_PREFILL held off, so the code predictor's 2-token first step
    takes the split path here (the joint one, the default, is the next test's)."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    monkeypatch.setattr(cp_mod, "CP_JOINT_PREFILL", False)
    texts = TEXTS * 3
    got = engine_codes("float32", texts=texts, max_num_seqs=16)
    assert_equals_reference(got, texts)


def test_gpu_joint_prefill_engine_equals_cpu_reference(monkeypatch):
    """code_predictor.CP_JOINT_PREFILL (set here whatever the default) at twelve requests (bucket 16, above the
    skinny sizes): the code predictor's 2-token first step as one pass of both positions' rows (the folded layers on
    2B rows) inside the step's CUDA graph (the spy sees the warm-up and capture calls): the same fp32 codes and
    audio as the CPU loop. (The tiny checkpoint's head_dim of 8 is below the fused attention kernels' minimum, so
    its attention runs the causal torch fallback; tests/gpu/test_gpu_cp_layer.py holds the kernels at real shapes.)"""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    monkeypatch.setattr(cp_mod, "CP_JOINT_PREFILL", True)
    ran, real = [], cp_mod.CodePredictor._joint_layers

    def spied(self, *a, **kw):
        out = real(self, *a, **kw)
        ran.append(out is not None)
        return out
    monkeypatch.setattr(cp_mod.CodePredictor, "_joint_layers", spied)
    texts = TEXTS * 3
    got = engine_codes("float32", texts=texts, max_num_seqs=16)
    assert any(ran), "the joint first step never ran"
    assert_equals_reference(got, texts)


def test_gpu_memory_limit_caps_the_allocator_and_the_total_is_reported():
    """gpu_memory_limit_bytes: the engine's reported peak total (allocator peak reservation + context and modules)
    stays within the limit while it serves, the allocator's share is capped, and the codes are unchanged."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    limit = (total - free) + 3 * 2 ** 30
    try:
        core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, "custom_voice"), device="cuda",
                                                   dtype="float32", max_num_seqs=8, num_kv_blocks=512,
                                                   codec_dtype="float32", gpu_memory_limit_bytes=limit))
        reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i), streaming=StreamingOptions(stream=False),
                              sampling=SamplingOptions(greedy=True, max_new_tokens=31)) for i, t in enumerate(TEXTS)]
        run_offline(core, reqs)
        stats = core.stats()
        assert 0 < stats["peak_gpu_memory_total_bytes"] <= limit, (stats["peak_gpu_memory_total_bytes"], limit)
        stages = core.startup["gpu_memory_outside_allocator_by_stage"]      # where the memory outside it grew
        # The default codec_sms ("auto"): half the SMs where this PyTorch has green contexts (engine/sm_partition.py;
        # a driver older than CUDA 12.8 under such a PyTorch would fall back and fail this: worth knowing on a GPU).
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        green = getattr(getattr(torch.cuda, "green_contexts", None), "SUPPORTED", False)
        assert core.startup["codec_sms"] == (auto_sms(sms) if green else None)
        assert list(stages)[:2] == ["context", "weights_and_kv"] and "decode_graphs" in stages
        assert all(0 < v <= limit for v in stages.values())
        with pytest.raises(torch.cuda.OutOfMemoryError):      # the cap binds: 4 GiB more do not fit
            torch.empty(4 * 2 ** 30, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_gpu_stack_limit_shrinks_and_frees_its_local_memory():
    """gpu_memory's stack-limit calls reach the CUDA runtime: growing the per-thread limit by 4 KB makes the driver
    reserve local memory for every resident thread (outside the allocator), and shrink_stack_to gives it back and
    says how much; an engine (which shrinks the limit after its load, before its graphs) serves the reference's
    codes."""
    from voxflow.engine.gpu_memory import outside_allocator_bytes, set_stack_limit_bytes, shrink_stack_to, \
        stack_limit_bytes
    device = torch.device("cuda", torch.cuda.current_device())
    start = stack_limit_bytes(device)
    assert start is not None and start > 0
    props = torch.cuda.get_device_properties(device)
    threads = props.multi_processor_count * props.max_threads_per_multi_processor
    torch.cuda.synchronize()
    before = outside_allocator_bytes(device)
    assert set_stack_limit_bytes(device, start + 4096) and stack_limit_bytes(device) >= start + 4096
    torch.cuda.synchronize()
    grown = outside_allocator_bytes(device) - before
    assert grown >= 4096 * threads * 0.9, (grown, threads)
    shrunk = shrink_stack_to(device, start)
    assert shrunk is not None and shrunk["to"] == start and stack_limit_bytes(device) == start
    assert shrunk["freed_bytes"] >= 0.9 * grown, (shrunk, grown)
    assert_equals_reference(engine_codes("float32", texts=TEXTS[:2]), TEXTS[:2])


def test_gpu_text_embedding_on_host_serves_the_reference(monkeypatch):
    """text_embedding_on_host: the talker's text table is loaded into host memory (the prompt builds gather rows
    there and project them on the GPU), and the engine serves the CPU reference's codes and audio."""
    import voxflow.models.qwen3_tts.model as model_mod
    tables, real = [], model_mod._move_text_embedding
    monkeypatch.setattr(model_mod, "_move_text_embedding", lambda talker, to, device: (
        real(talker, to, device), tables.append(talker.model.text_embedding.weight))[0])
    got = engine_codes("float32", texts=TEXTS[:2], text_embedding_on_host=True)
    assert len(tables) == 1 and tables[0].device.type == "cpu" and tables[0].abs().sum() > 0   # loaded, on the host
    assert_equals_reference(got, TEXTS[:2])


def test_gpu_decode_captures_warm_up_on_one_stream(monkeypatch):
    """Every decode graph's warm-up runs on the runner's one side stream (a new stream per capture kept a cuBLAS
    workspace and a block cache each: graph_runner.warm_then_capture), and the codes stay the reference's."""
    import voxflow.engine.graph_runner as graph_runner
    sides, real = [], graph_runner.warm_then_capture
    monkeypatch.setattr(graph_runner, "warm_then_capture",
                        lambda run, pool, side=None: (sides.append(side), real(run, pool, side))[1])
    got = engine_codes("float32", texts=TEXTS[:1])
    assert len(sides) > 1 and isinstance(sides[0], torch.cuda.Stream) and all(s is sides[0] for s in sides)
    assert_equals_reference(got, TEXTS[:1])


def test_gpu_one_row_norm_linear_layers_equal_cpu_reference(monkeypatch):
    """qwen3_layer.ONE_ROW_NORM_LINEAR (on by default; set here so the test holds whatever the default): one
    request alone, so the talker's layers run at one row with their norms folded into q|k|v and gate|up: the
    same fp32 codes and audio as the CPU loop."""
    import voxflow.layers.qwen3_layer as layer_mod
    monkeypatch.setattr(layer_mod, "ONE_ROW_NORM_LINEAR", True)
    ran = record_runs(monkeypatch, layer_mod.Qwen3DecoderLayer, "_forward_one_row")
    got = engine_codes("float32", True, True, texts=TEXTS[1:2])
    assert ran and all(ran), "the one-row path did not run (or declined the shapes)"
    codes, wav = reference(TEXTS[1])
    assert torch.equal(got["0"][0].cpu(), codes)
    assert np.abs(got["0"][1] - wav).max() <= 1e-4


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs compute capability >= 9")
def test_gpu_engine_codes_equal_with_pdl_on_and_off():
    """Programmatic dependent launch (voxflow/kernels/pdl.py) on every decode kernel that takes it -- the talker's
    q/k norm + RoPE, paged attention and its split merge, the token selection, the code predictor's attention at
    more than one row, besides the GEMM kernels: the engine in bf16 with CUDA graphs gives the same codes and audio
    with it on and off, one request alone (one-row layers) and twelve together. PDL changes when a kernel starts,
    never what it computes: a difference means a read before griddepcontrol.wait."""
    from voxflow.kernels import pdl_enabled, set_pdl_enabled
    saved = pdl_enabled()
    try:
        for texts, seqs in ((TEXTS[1:2], 8), (TEXTS * 3, 16)):
            runs = []
            for on in (True, False):
                set_pdl_enabled(on)
                runs.append(engine_codes("bfloat16", texts=texts, max_num_seqs=seqs))
            for rid, (codes, wav) in runs[0].items():
                assert torch.equal(codes, runs[1][rid][0]), rid
                assert np.array_equal(wav, runs[1][rid][1]), rid
    finally:
        set_pdl_enabled(saved)


def test_gpu_sampled_codes_equal_with_16_and_32_key_bits(monkeypatch):
    """The draws' top-k threshold from the top 16 key bits of bf16 logits (select_tokens.key_bits) against all 32
    (VOXFLOW_SELECT_FULL_KEYS, the path before): the bf16 engine sampling with the model's defaults (top-k, a
    temperature), seeded, one request alone and twelve together, gives the same codes and audio."""
    from voxflow.kernels import select_tokens
    seeded = lambda i: SamplingOptions(seed=1000 + i, max_new_tokens=31, ignore_eos=True)
    real_key_bits, used = select_tokens.key_bits, []

    def recording_key_bits(*args):
        used.append(real_key_bits(*args))
        return used[-1]
    monkeypatch.setattr(select_tokens, "key_bits", recording_key_bits)
    for texts, seqs in ((TEXTS[1:2], 8), (TEXTS * 3, 16)):
        runs = []
        for full in (False, True):
            monkeypatch.setattr(select_tokens, "FULL_KEYS", full)
            used.clear()
            runs.append(engine_codes("bfloat16", texts=texts, sampling=seeded, max_num_seqs=seqs))
            # the draws ran the kernel: the code predictor's from bf16 logits on 16 bits (32 with FULL_KEYS)
            assert (16 in used) != full and 32 in used, (full, sorted(set(used)))
        for rid, (codes, wav) in runs[0].items():
            assert codes.shape[0] >= 30
            assert torch.equal(codes, runs[1][rid][0]), rid
            assert np.array_equal(wav, runs[1][rid][1]), rid


def test_gpu_fp32_single_request_equals_cpu_reference(monkeypatch):
    """One request alone (the c=1 path: the one-row skinny GEMMs -- down_proj with silu * up, the code predictor's
    norm + lm_head and projection -- and the warm-up requests before it): the same codes as the CPU loop. With
    ONE_ROW_NORM_LINEAR off (VOXFLOW_ONE_ROW_NORM_LINEAR=0: the norms on their own kernel, q|k|v and gate|up on
    cuBLAS); the test above holds it on."""
    import voxflow.layers.qwen3_layer as layer_mod
    monkeypatch.setattr(layer_mod, "ONE_ROW_NORM_LINEAR", False)
    got = engine_codes("float32", True, True, texts=TEXTS[1:2])
    codes, wav = reference(TEXTS[1])
    assert torch.equal(got["0"][0].cpu(), codes)
    assert np.abs(got["0"][1] - wav).max() <= 1e-4


def test_gpu_prefill_graphs_survive_slot_buffer_growth():
    """A request whose text is longer than all of the slot table's trailing-text pages (2 slots x 256 rows) makes
    the model reallocate them (graph_epoch changes) while the others are served. The prefill graphs
    read none of those buffers and must stay: the H200 voice-clone benchmark of 2026-12-01 crashed on a prefill
    replay planned just before they were dropped (KeyError), and every later prompt would have run eagerly. The
    decode graphs are captured again, into a new memory pool (capturing into the released one failed a PyTorch
    assert in the same benchmark)."""
    long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)          # 600 text rows
    core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, "custom_voice"), device="cuda",
                                               dtype="float32", max_num_seqs=2, num_kv_blocks=1024, block_size=16))
    graphs, epoch, pool = len(core.prefill_runner._graphs), core.model.graph_epoch, core.runner._pool
    # Streaming-text prompts (non_streaming_mode=False) keep the text past the prompt in the slot's trailing buffer.
    reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i), streaming=StreamingOptions(stream=False),
                          non_streaming_mode=False, sampling=SamplingOptions(greedy=True, max_new_tokens=11))
            for i, t in enumerate([TEXTS[0], long_text, TEXTS[2], TEXTS[3]])]
    results = run_offline(core, reqs[:2])
    assert core.model.graph_epoch != epoch                         # the growth happened
    stats = core.prefill_runner.stats
    replays, eager = stats.replays, stats.eager_steps
    results += run_offline(core, reqs[2:])                         # after the growth: still through the graphs
    assert len(core.prefill_runner._graphs) == graphs > 0
    # (a replay may hold several prompts: the H200 run of 2026-12-01 made one replay of both)
    assert stats.replays > replays and stats.eager_steps == eager
    assert core.runner.stats.replays > 0 and core.runner._graphs                 # decode graphs captured again,
    assert core.runner._pool is not pool                                          # into a new memory pool
    assert all(r.audio().size > 0 for r in results) and len(results) == 4


@pytest.mark.parametrize("on", [True, False], ids=["pdl", "no-pdl"])
def test_gpu_engine_with_and_without_programmatic_dependent_launch_equals_cpu_reference(on):
    """VOXFLOW_PDL (voxflow/kernels/pdl.py, on by default on Hopper): the decode kernels launched with
    programmatic dependent launch inside the captured decode graphs give the CPU loop's codes and audio (a kernel
    that read its predecessor's output before griddepcontrol.wait would read stale rows and change them); and
    with it off (VOXFLOW_PDL=0), the same. Four requests (the skinny GEMMs of 4-row steps) and one alone (one-row
    steps: the code predictor's fused layer kernels)."""
    from voxflow.kernels import pdl_enabled, set_pdl_enabled, use_pdl
    if on and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability >= 9 (Hopper)")
    saved = pdl_enabled()
    set_pdl_enabled(on)
    try:
        got = engine_codes("float32", texts=TEXTS)
        assert use_pdl(torch.empty(1, device="cuda")) is on       # the engine left the kernels on: PDL ran (or not)
        alone = engine_codes("float32", texts=TEXTS[1:2])
    finally:
        set_pdl_enabled(saved)
    assert_equals_reference(got, TEXTS)
    assert_equals_reference(alone, TEXTS[1:2])



def test_gpu_talker_folded_norms_engine_equals_cpu_reference(monkeypatch):
    """qwen3_layer.FOLDED_NORMS_PAGED (set here whatever the default): twelve requests (decode bucket 16, above the
    skinny sizes), so the talker's layer steps run with both norms folded into q|k|v and gate|up (qk_norm_rope
    scaling q / k / v by the row factor before the paged attention): the same fp32 codes and audio as the CPU loop,
    the folded path taken through the paged view."""
    import voxflow.layers.paged_attention as pa
    import voxflow.layers.qwen3_layer as layer_mod
    monkeypatch.setattr(layer_mod, "FOLDED_NORMS_PAGED", True)
    paged, real = [], layer_mod.Qwen3DecoderLayer._forward_folded

    def spied(self, x, cos, sin, cache, x_owned):
        out = real(self, x, cos, sin, cache, x_owned)
        if isinstance(cache, pa.PagedLayerView):
            paged.append(out is not None)
        return out
    monkeypatch.setattr(layer_mod.Qwen3DecoderLayer, "_forward_folded", spied)
    texts = TEXTS * 3
    got = engine_codes("float32", texts=texts, max_num_seqs=16)
    assert paged and any(paged), "the talker's folded path never ran"
    assert_equals_reference(got, texts)


def twelve_requests_with(monkeypatch, switches: dict, spied: str) -> list[tuple[int, int]]:
    """Twelve requests (decode bucket 16) through the fp32 engine with qwen3_layer's `switches` set and
    skinny_linear's function `spied` counted; asserts the CPU loop's codes and audio -> each spied call's (rows of
    x, rows of W)."""
    import voxflow.layers.qwen3_layer as layer_mod
    from voxflow.kernels import skinny_linear as sk
    for name, value in switches.items():
        monkeypatch.setattr(layer_mod, name, value)
    calls, real = [], getattr(sk, spied)
    monkeypatch.setattr(sk, spied, lambda *a, **kw: (calls.append((a[0].shape[0], a[1].shape[0])), real(*a, **kw))[1])
    texts = TEXTS * 3
    assert_equals_reference(engine_codes("float32", texts=texts, max_num_seqs=16), texts)
    return calls


def test_gpu_talker_skinny_gemms_engine_equals_cpu_reference(monkeypatch):
    """qwen3_layer.TALKER_SKINNY_GEMMS (an experiment switch, set here; the code predictor's off, so only the
    talker's GEMMs are counted): its folded layer steps run their GEMMs on skinny_linear above the skinny sizes;
    the same fp32 codes and audio as the CPU loop."""
    calls = twelve_requests_with(monkeypatch, dict(FOLDED_NORMS_PAGED=True, TALKER_SKINNY_GEMMS=True,
                                                   CP_SKINNY_GEMMS=False), "skinny_linear")
    assert any(rows > 8 for rows, _ in calls), "the talker's GEMMs never ran on skinny_linear above the skinny sizes"


def test_gpu_skinny_heads_engine_equals_cpu_reference(monkeypatch):
    """qwen3_layer.SKINNY_HEADS (an experiment switch, set here): the code predictor's folded heads (vocab 2048) and
    the talker's codec_head (3072) run on skinny_linear above the skinny sizes (counted by the weights' rows); the
    same fp32 codes and audio as the CPU loop."""
    calls = twelve_requests_with(monkeypatch, dict(SKINNY_HEADS=True), "skinny_linear")
    heads = {n for rows, n in calls if rows > 8}
    print(f"head GEMMs above 8 rows on skinny_linear, by output width: {sorted(heads)}")
    assert {2048, 3072} <= heads, "the heads never ran on skinny_linear above the skinny sizes"


def test_gpu_outputs_sent_while_the_host_waits_equal_cpu_reference(monkeypatch):
    """emit_while_waiting: on a GPU the host polls the codec while it waits for the decode in flight, and the chunks
    (and finals) that land leave at once (how many depends on the GPU's timing: printed; the CPU test with a
    simulated clock holds the logic); every request's codes and audio are the CPU loop's."""
    early = []
    real = EngineCore._emit_while_waiting

    def spied(self, event):
        before = self._early_chunks + self._early_finals
        real(self, event)
        early.append(self._early_chunks + self._early_finals - before)
    monkeypatch.setattr(EngineCore, "_emit_while_waiting", spied)
    got = engine_codes("float32", texts=TEXTS, emit_while_waiting=True,
                       streaming=StreamingOptions(initial_chunk_frames=2, chunk_frames=5))
    print(f"{len(early)} waits polled, {sum(early)} outputs sent early")
    assert early                                        # the GPU's decodes carried events: the waits were polled
    assert_equals_reference(got, TEXTS)


def test_gpu_arrivals_taken_while_the_host_waits_equal_cpu_reference():
    """intake_while_waiting: two requests go in at the start, the other two one at a time through the driver's
    `arrivals` (as the engine process's loop hands it its socket's adds), which the core calls mid-step only while
    its decode still runs on the GPU; both are taken there, and every request's codes and audio are the CPU loop's."""
    from voxflow.engine.inprocess import CoreDriver
    core = EngineCore.from_config(EngineConfig(
        model=os.path.join(TINY, "custom_voice"), device="cuda", dtype="float32", cuda_graphs=True, kernels=True,
        max_num_seqs=8, num_kv_blocks=512, block_size=16, codec_dtype="float32", intake_while_waiting=True))
    frames = record_frames(core)
    reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i), streaming=StreamingOptions(stream=False),
                          sampling=SamplingOptions(greedy=True, max_new_tokens=31)) for i, t in enumerate(TEXTS)]
    driver = CoreDriver(core)
    driver.add_many(reqs[:2])
    pending, taken, outs = list(reqs[2:]), [], {}

    def arrivals():
        if pending:
            taken.append(core.steps)
            driver.add_many([pending.pop(0)])
    while driver.has_work():
        for o in driver.step(arrivals=arrivals):
            outs.setdefault(o.request_id, []).append(o)
    print(f"arrivals taken mid-step in steps {taken}")
    assert not pending and len(taken) == 2
    assert_equals_reference(served(reqs, outs, frames), TEXTS)


def test_gpu_prefill_on_its_own_stream_beside_the_decode_equals_cpu_reference():
    """prefill_stream (engine/prefill_lane.py): requests 2 and 3 arrive while 0 and 1 decode, so their prefills run
    on the lane's stream beside those decodes (slots attached on the talker's stream first, their first decode a step
    later behind the lane); every request's codes and audio are the CPU loop's (a missing order between the two
    streams would show as stale or wrong frames)."""
    core = EngineCore.from_config(EngineConfig(
        model=os.path.join(TINY, "custom_voice"), device="cuda", dtype="float32", cuda_graphs=True, kernels=True,
        max_num_seqs=8, num_kv_blocks=512, block_size=16, codec_dtype="float32", prefill_stream=True))
    assert core._prefill_lane is not None
    frames = record_frames(core)
    beside, run_prefills = [], core._run_prefills

    def noting(chunks):
        beside.append(core.scheduler.num_running - len(chunks))     # streams decoding in this step too
        return run_prefills(chunks)
    core._run_prefills = noting
    reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i), streaming=StreamingOptions(stream=False),
                          sampling=SamplingOptions(greedy=True, max_new_tokens=31)) for i, t in enumerate(TEXTS)]
    core.add_requests(reqs[:2])
    outs, step = {}, 0
    while core.has_work() or step <= 3:
        if step == 3:
            core.add_requests(reqs[2:])
        for o in core.step():
            outs.setdefault(o.request_id, []).append(o)
        step += 1
    print(f"prefill steps, streams decoding beside them: {beside}")
    assert any(n > 0 for n in beside)
    assert_equals_reference(served(reqs, outs, frames), TEXTS)


def test_gpu_served_waves_compile_no_triton_kernel_after_startup():
    """No kernel compiles on the hot path (issue 6): the engine in its serving configuration (bf16 talker, graphs,
    kernels, the codec's default dtype, streamed chunks) serves three waves of prompts of several lengths, some
    arriving while others stream, and Triton compiles (or loads from its disk cache) no kernel after startup
    (kernel_compiles.py). A compile there stalls every stream for ~0.3-1.5 s (session 63: one 307 ms prefill step at
    0.6B c=64 that its trace could not explain). A failure names the kernels: a shape the startup did not warm."""
    from voxflow.engine.inprocess import CoreDriver
    core = EngineCore.from_config(EngineConfig(
        model=os.path.join(TINY, "custom_voice"), device="cuda", dtype="bfloat16", cuda_graphs=True, kernels=True,
        max_num_seqs=16, num_kv_blocks=1024, block_size=16))
    if not core.kernel_compiles.available:
        pytest.skip("this Triton has no compilation listener (triton.knobs.compilation.listener)")
    print(f"startup: {core.startup.get('triton_compiles')}")
    allocs_before = {k: core.stats()[k] for k in ("alloc_retries", "cuda_mallocs")}
    texts = [t * k for k in (1, 3, 8) for t in TEXTS]            # prompt lengths from a few tokens to ~100
    reqs = [SpeechRequest(text=t, voice="vivian", request_id=str(i),
                          streaming=StreamingOptions(stream=True),
                          sampling=SamplingOptions(greedy=True, max_new_tokens=40 + 7 * i))
            for i, t in enumerate(texts)]
    driver = CoreDriver(core)
    waves = [reqs[:4], reqs[4:10], reqs[10:]]
    driver.add_many(waves.pop(0))
    finals, steps = 0, 0
    while driver.has_work() or waves:
        steps += 1
        if waves and steps % 9 == 0:                                # a wave arrives while the others stream
            driver.add_many(waves.pop(0))
        finals += sum(isinstance(o, FinalRecord) and o.error is None for o in driver.step())
    stats = core.stats()["kernels_compiled_while_serving"]
    allocs = {k: core.stats()[k] - v for k, v in allocs_before.items()}
    core.shutdown()
    print(f"while serving: {stats}; the allocator's retries and cudaMallocs meanwhile (reported, not held): {allocs}")
    assert finals == len(reqs)
    assert stats["compiles"] == 0 and stats["cache_loads"] == 0, \
        f"Triton kernels first used after startup: {stats['kernels']}"
