"""An engine's startup, apart from its step loop: loading what EngineConfig names (`load_core`, behind
`EngineCore.from_config`), sizing the KV pool (`kv_pool_blocks`) and choosing the prefill runner
(`make_prefill_runner`), then capturing the graphs and running the warm-up requests (`warm_up`), with the time and
the GPU memory outside the allocator each stage took in `core.startup`."""
from __future__ import annotations

import logging
import time

import torch

from .block_manager import default_kv_bytes, num_blocks_for
from .config import EngineConfig
from .gpu_memory import limit_allocator, outside_allocator_bytes, room_within, shrink_stack_to, stack_limit_bytes
from .model_api import check_kv_cache_dtype
from .packed_prefill import PackedPrefillRunner
from .prefill_runner import PrefillRunner

log = logging.getLogger("voxflow.engine")


def check_fp8_pages(kv_cache_dtype: str, device: torch.device) -> None:
    """fp8 KV pages on a CUDA device with the kernels on need Triton's e4m3 type there (compute capability >= 8.9)."""
    from ..kernels import fp8_kernels_supported, kernels_enabled
    if kv_cache_dtype == "fp8" and device.type == "cuda" and kernels_enabled() and not fp8_kernels_supported(device):
        raise ValueError(f"kv_cache_dtype=fp8 needs a GPU of compute capability >= 8.9 for its attention kernels "
                         f"({torch.cuda.get_device_name(device)} is not one); serve without it, or with kernels=false")


def kv_pool_blocks(config: EngineConfig, spec, device: torch.device) -> int:
    """KV pages in the pool (`spec`: model_api.pool_spec's): as many as asked, else the bytes asked, else the
    default share of the GPU's free memory, within `gpu_memory_limit_bytes` when set."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    if free is not None and config.gpu_memory_limit_bytes is not None:     # the pool fits under the cap
        free = min(free, room_within(device, config.gpu_memory_limit_bytes))
    budget = config.kv_cache_bytes or default_kv_bytes(spec.bytes_per_token, config.max_num_seqs, free)
    return num_blocks_for(budget, spec, config.block_size)


def make_prefill_runner(model, k_cache, v_cache, config: EngineConfig, num_blocks: int, max_width: int,
                        device: torch.device):
    """The runner of whole-prompt prefills (CUDA graphs on a GPU by default): packed, else padded; None where the
    engine runs them eagerly (prefill_dispatch.py)."""
    from ..kernels import kernels_enabled
    want = config.prefill_graphs if config.prefill_graphs is not None else config.cuda_graphs and device.type == "cuda"
    if not want or not hasattr(model, "prefill_forward"):
        return None
    # Packed rows attend through the tiled kernel; without it (kernels off on a GPU) the reference path's per-row
    # context gathers of the large packed shapes would take GBs: the padded runner then.
    if config.packed_prefill and (device.type != "cuda" or kernels_enabled()):
        return PackedPrefillRunner(model, k_cache, v_cache, config.block_size, num_blocks,
                                   config.max_num_batched_tokens, config.max_num_seqs, max_width, config.cuda_graphs)
    if config.packed_prefill:
        log.info("packed_prefill needs the Triton kernels on a GPU (kernels are off here): the padded prefill graphs "
                 "run instead")
    return PrefillRunner(model, k_cache, v_cache, config.block_size, num_blocks, config.max_num_batched_tokens,
                         config.max_num_seqs, config.cuda_graphs)


def load_core(cls, config: EngineConfig):
    """An engine of class `cls` on the model and codec `config` names: the kernels switch and the checks that need
    no weights first, the GPU memory cap before the weights, the load (models.registry), then the engine."""
    from ..kernels import set_kernels_enabled
    from ..models.registry import load_for_engine
    set_kernels_enabled(config.kernels)          # process-wide: one engine per process
    check_kv_cache_dtype(config.kv_cache_dtype)  # a bad value fails before the weights load, not after
    check_fp8_pages(config.kv_cache_dtype, torch.device(config.device))
    if config.gpu_memory_limit_bytes is not None:      # before the weights: the cap covers everything after
        limit_allocator(torch.device(config.device), config.gpu_memory_limit_bytes)
    options = {"max_frames": config.max_model_len}     # no request it accepts outgrows the slot buffers
    if config.codec_dtype != "auto":
        options["codec_dtype"] = config.codec_dtype
    if not config.cuda_graphs:
        options["codec_cuda_graphs"] = False
    if config.codec_max_batch is not None:
        options["codec_max_batch"] = config.codec_max_batch
    if config.text_embedding_on_host and torch.device(config.device).type == "cuda":
        options["text_embedding_on_host"] = True
    if config.codec_sms is not None:
        options["codec_sms"] = config.codec_sms
    if config.preload_text_rows:                      # (the loader preloads on a GPU only)
        options["preload_text_rows"] = True
    elif config.preload_text_ids:
        options["preload_text_ids"] = config.preload_text_ids
    device = torch.device(config.device)
    before_weights = outside_allocator_bytes(device) if device.type == "cuda" else None
    stack = stack_limit_bytes(device) if config.shrink_stack_after_load else None
    model, codec = load_for_engine(config.model, device=config.device, dtype=config.dtype,
                                   max_slots=config.max_num_seqs, **options)
    # A kernel of the load's one-off work may have grown the driver's local-memory reservation for good
    # (gpu_memory.py); back to the limit of before, while no graph is captured yet.
    shrunk = shrink_stack_to(device, stack)
    core = cls(model, codec, config)
    if shrunk is not None:
        core.startup["stack_limit_shrunk"] = shrunk
    if before_weights is not None:              # the stages warm_up recorded, after the context's own share
        stages = core.startup.get("gpu_memory_outside_allocator_by_stage", {})
        core.startup["gpu_memory_outside_allocator_by_stage"] = {"context": before_weights, **stages}
    return core


def warm_up(core) -> None:
    """Capture the decode graphs (and the codec's) up front, and report the time it took (and on a GPU the
    memory outside the allocator after each stage: engine/gpu_memory.py)."""
    cfg = core.config
    device = torch.device(core.model.device)
    on_gpu = device.type == "cuda"
    stages: dict = {}

    def stage(name: str) -> None:
        if on_gpu:
            stages[name] = outside_allocator_bytes(device)
    stage("weights_and_kv")
    if core.runner.cuda_graphs and cfg.capture_at_start:
        with torch.no_grad():
            core.startup["graph_capture_seconds"] = round(core.runner.capture(widths=[1, 2, 4, 8, 16]), 3)
        core.startup["graphs"] = core.runner.stats.graphs
        stage("decode_graphs")
    if core.prefill_runner is not None and core.prefill_runner.cuda_graphs and cfg.capture_at_start:
        core.startup["prefill_graph_capture_seconds"] = round(core.prefill_runner.capture(), 3)
        core.startup["prefill_graphs"] = core.prefill_runner.stats.graphs
        stage("prefill_graphs")
    warm = getattr(core.codec, "warmup", None)
    if warm is not None and on_gpu and cfg.capture_at_start:
        frame_counts = sorted({1, 2, 5, 10, cfg.chunk_frames})
        core.startup["codec_capture_seconds"] = round(warm(core.runner.buckets, frame_counts), 3)
        stage("codec_graphs")
    wanted = cfg.warmup_requests if cfg.warmup_requests is not None else (on_gpu and cfg.capture_at_start)
    if wanted and hasattr(core.model, "warmup_requests"):
        run_warmup_requests(core)
        stage("warmup_requests")
    if on_gpu:
        core.startup["gpu_memory_outside_allocator_by_stage"] = stages


def run_warmup_requests(core) -> None:
    """The model's warm-up requests (one alone, then the rest together, their prompts built in one batch as a
    burst of arrivals is), outputs dropped, then every counter back to zero: the stats describe served requests
    only. A failure is reported, not fatal."""
    t0 = time.perf_counter()
    requests = core.model.warmup_requests()
    try:
        for group in (requests[:1], requests[1:]):
            for error in core.add_requests(group):
                if error is not None:
                    raise error
            while core.has_work():
                core.step()
    except Exception as e:                                      # noqa: BLE001 - reported in the startup record
        log.warning("warm-up requests failed: %s", e)
        core.startup["warmup_error"] = str(e)
        for rid in list(core.live):
            core.abort(rid)
    core.reset_stats()
    core.startup["warmup_seconds"] = round(time.perf_counter() - t0, 3)
