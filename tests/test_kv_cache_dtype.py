"""EngineConfig.kv_cache_dtype: the talker's KV pages stored in fp8 (e4m3, unscaled) instead of the model's dtype.

What is held here (the kernels' own fp8 cases are in test_kernel_paged_attention.py / test_kernel_paged_prefill.py
and tests/gpu):
- the pool's size: a byte an element, so a pool of the same bytes has twice the pages of a bf16 one;
- a bad value is refused before any weights load;
- the engine serves with fp8 pages end to end (prefill writes, decode reads, pages released);
- the stated precision: attention at the talker's head shapes (16 query / 8 KV heads, head_dim 128) over RMS-normed
  keys and unit-normal values, 256-position contexts, fp8 pages against fp32 ones: relative RMS error of the output
  < 5% (measured 3.8%; bf16 pages 0.24%, held < 0.5%). It is a lossy opt-in: the greedy codes of the tiny random
  checkpoint, whose logits are nearly flat, already differ from the fp32 reference's in the first frame, so no
  code-equality claim is made for it.
"""
from __future__ import annotations

import os

import pytest
import torch

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.model_api import KVSpec, PagedKVContext, pool_spec
from voxflow.engine.request import AudioChunk, FinalRecord, SamplingOptions, SpeechRequest, StreamingOptions
from voxflow.layers.attention import attention_bias
from voxflow.layers.paged_attention import PagedKVView

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
needs_tiny = pytest.mark.skipif(not TINY, reason="VOXFLOW_TINY_DIR is not set (the tiny checkpoint set)")


def test_fp8_pool_spec_halves_the_bytes_of_a_position():
    spec = KVSpec(num_layers=28, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    assert pool_spec(spec, "auto") is spec
    fp8 = pool_spec(spec, "fp8")
    assert fp8.dtype == torch.float8_e4m3fn and fp8.num_layers == 28
    assert fp8.bytes_per_token * 2 == spec.bytes_per_token == 2 * 28 * 8 * 128 * 2
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        pool_spec(spec, "int4")


def test_a_bad_kv_cache_dtype_is_refused_before_the_weights_load(monkeypatch):
    import voxflow.models.registry as registry

    def no_load(*a, **k):
        raise AssertionError("the weights were loaded before the config was checked")
    monkeypatch.setattr(registry, "load_for_engine", no_load)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineCore.from_config(EngineConfig(model="unused", kv_cache_dtype="fp16"))


def test_fp8_pages_are_refused_on_gpus_whose_triton_has_no_e4m3(monkeypatch):
    import voxflow.kernels as K
    import voxflow.models.registry as registry
    from voxflow.engine.engine import check_fp8_pages

    def no_load(*a, **k):
        raise AssertionError("the weights were loaded before the device was checked")
    monkeypatch.setattr(registry, "load_for_engine", no_load)
    monkeypatch.setattr(K, "_enabled", True)
    monkeypatch.setattr(K, "_triton_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "an sm_80 GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability >= 8.9"):
        EngineCore.from_config(EngineConfig(model="unused", device="cuda", kv_cache_dtype="fp8"))
    check_fp8_pages("auto", torch.device("cuda"))                  # bf16 pages: nothing to check
    monkeypatch.setattr(K, "_enabled", False)
    check_fp8_pages("fp8", torch.device("cuda"))                   # kernels off: the torch path takes fp8 anywhere
    monkeypatch.setattr(K, "_enabled", True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8_pages("fp8", torch.device("cuda"))


def test_fp8_pool_writes_saturate_instead_of_poisoning_a_page():
    pool = torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn)
    kv = PagedKVContext([pool], [pool.clone()], 4, torch.tensor([[0]]), torch.tensor([1]), torch.tensor([[0]]))
    new = torch.tensor([1e4, -1e4, 500.0, 1.0, 0.5, -2.0, 448.0, 0.0]).view(1, 1, 1, 8)
    PagedKVView(kv, 1).write(pool, new)
    assert pool[0, 0, 0].float().tolist() == [448.0, -448.0, 448.0, 1.0, 0.5, -2.0, 448.0, 0.0]


def attend(pool_dtype, q, k, v, lens, block_size=16):
    """One decode attention through PagedLayerView.attend (the reference path on a CPU) over pages of pool_dtype that
    hold each row's context k / v [B, T, Hkv, D] (the last position arriving as the new token)."""
    batch, t, hkv, d = k.shape
    pages = t // block_size
    pools = [torch.zeros(batch * pages + 1, block_size, hkv, d, dtype=pool_dtype) for _ in range(2)]
    tables = torch.arange(batch * pages).view(batch, pages)
    for pool, x in zip(pools, (k, v)):
        pool[:-1] = x.reshape(batch * pages, block_size, hkv, d).to(pool_dtype)
    slots = (tables[:, -1] * block_size + block_size - 1)[:, None]
    kv = PagedKVContext([pools[0]], [pools[1]], block_size, tables, lens, slots)
    view = PagedKVView(kv, 1)
    new_k, new_v = k[:, -1, :, None], v[:, -1, :, None]                    # [B, Hkv, 1, D]
    bias = attention_bias(1, view.num_keys, view.key_valid, batch=batch, dtype=q.dtype, device=q.device)
    return view[0].attend(q[:, :, None], new_k, new_v, bias, d ** -0.5)


def test_fp8_pages_keep_attention_within_the_stated_error_at_the_talkers_head_shapes():
    gen = torch.Generator().manual_seed(0)
    batch, t, hkv, group, d = 4, 256, 8, 2, 128
    k = torch.randn(batch, t, hkv, d, generator=gen)
    k = k / k.pow(2).mean(-1, keepdim=True).sqrt()               # the talker's keys leave an RMSNorm
    v = torch.randn(batch, t, hkv, d, generator=gen)
    q = torch.randn(batch, hkv * group, d, generator=gen)
    lens = torch.full((batch,), t)
    exact = attend(torch.float32, q, k, v, lens)

    def rel_rms(pool_dtype):
        out = attend(pool_dtype, q, k, v, lens)
        assert out.dtype == torch.float32 and out.shape == exact.shape
        return ((out - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item()
    fp8, bf16 = rel_rms(torch.float8_e4m3fn), rel_rms(torch.bfloat16)
    assert 0 < fp8 < 0.05, fp8
    assert bf16 < 0.005 and bf16 < fp8 / 5, (bf16, fp8)


@needs_tiny
def test_engine_serves_with_fp8_pages_and_a_pool_of_the_same_bytes_holds_more_pages():
    def engine(**kw):
        return EngineCore.from_config(EngineConfig(model=os.path.join(TINY, "custom_voice"), max_num_seqs=4,
                                                   max_num_batched_tokens=96, block_size=4,
                                                   kv_cache_bytes=1 << 20, **kw))
    plain, fp8 = engine(), engine(kv_cache_dtype="fp8")
    assert all(t.dtype == torch.float8_e4m3fn for t in fp8.k_cache + fp8.v_cache)
    assert fp8.startup["kv_cache_dtype"] == "float8_e4m3fn" and plain.startup["kv_cache_dtype"] == "float32"
    # (4x on this CPU's fp32 model, 2x against a bf16 one: bytes a position over the pool's fixed bytes)
    ratio = plain.k_cache[0].element_size()
    assert abs(fp8.block_manager.num_blocks - ratio * plain.block_manager.num_blocks) < ratio
    assert fp8.startup["kv_cache_bytes"] <= plain.startup["kv_cache_bytes"]
    requests = [SpeechRequest(text=text, voice="vivian", request_id=rid,
                              sampling=SamplingOptions(greedy=True, max_new_tokens=12, ignore_eos=True),
                              streaming=StreamingOptions(initial_chunk_frames=2, chunk_frames=5))
                for rid, text in (("a", "Hello there, a longer sentence for the pages."), ("b", "Hi."))]
    audio = {}
    for core in (plain, fp8):
        for r in requests:
            core.add_request(r)
        outputs: dict[str, list] = {}
        while core.has_work():
            for out in core.step():
                outputs.setdefault(out.request_id, []).append(out)
            core.block_manager.check_invariants()
        assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
        for r in requests:
            final = outputs[r.request_id][-1]
            assert isinstance(final, FinalRecord) and final.reason.value == "length", final
            pcm = b"".join(o.pcm for o in outputs[r.request_id] if isinstance(o, AudioChunk))
            audio[core is fp8, r.request_id] = torch.frombuffer(bytearray(pcm), dtype=torch.float32)
    for r in requests:
        got, want = audio[True, r.request_id], audio[False, r.request_id]
        assert got.shape == want.shape and got.numel() > 0 and got.isfinite().all() and got.abs().max() > 0
