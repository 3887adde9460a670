"""EngineConfig: everything an EngineCore is built from (model, memory, batching, streaming, GPU switches).

Every field can be set from the command line as `--engine-arg KEY=VALUE` (`voxflow serve`, `voxflow bench`;
engine_args.py), which is how the stacked comparisons switch pieces off one by one.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    model: str                                 # model folder or hub id
    device: str = "cpu"
    dtype: str = "float32"
    max_num_seqs: int = 32                     # requests decoding at once (model slots)
    max_num_batched_tokens: int = 4096         # positions computed per step (decodes + prefill chunks). 4096, not
                                               # 2048: a burst's prompts in half the steps (H200 session 26 call 2,
                                               # 1.7B offline c=256 on unique prompts: 985 -> 1,124 audio-s/s, TTFP
                                               # p99 696 -> 551 ms)
    prefill_chunk_size: int | None = 512       # most prompt positions of one request per step
    block_size: int = 16                       # positions per KV page
    kv_cache_bytes: int | None = None          # memory for the KV pool (default: block_manager.default_kv_bytes)
    num_kv_blocks: int | None = None           # or an explicit number of pages (tests: a tiny pool)
    kv_cache_dtype: str = "auto"               # what the pages store: auto = the model's dtype; fp8 = e4m3,
                                               # unscaled (model_api.pool_spec): half the bytes a position, and
                                               # half what decode attention reads a step; a lossy opt-in
    max_model_len: int = 10240                 # most KV positions of one request (prompt + frames)
    gpu_memory_limit_bytes: int | None = None  # on a GPU: cap the allocator at this many bytes less what the CUDA
                                               # context holds when the engine starts (what the context adds later
                                               # is reported, not capped: gpu_memory.py); a default KV pool is
                                               # sized under it; applied by from_config; None: no cap
    shrink_stack_after_load: bool = True       # on a GPU: the per-thread stack limit back to its value before the
                                               # load once the load is done (the local memory a one-off kernel of
                                               # the load made the driver reserve for good: gpu_memory.py)
    kv_reserve_frames: int = 0                 # admit a request only with KV room for every request's next this
                                               # many frames (scheduler.py); 0: admit on the prompt alone
    chunk_frames: int = 25                     # regular streaming chunk (2 s of audio at 12.5 Hz)
    chunk_ramp: bool = True                    # chunks after the first grow up to chunk_frames (codec_executor)
    chunk_ramp_factor: float = 2.0             # ... each at most the audio already sent times this (>= 1): at 2
                                               # 5, 10, 25, ... (at 1: 5, 5, 10, 10, 25, ...). Fewer, larger codec
                                               # calls; the next chunk is ready in time while a stream's engine runs
                                               # under 1 / factor of real time during its ramp (RTF at c=64: ~0.08).
                                               # Session 57 (H100, 0.6B c=64 over HTTP, alternating), 2 + tail 10
                                               # (8 chunks a request, not 12): 759.3 / 757.7 / 754.3 audio-s/s
                                               # against 745.8 / 748.2 at 1 + tail 5, no stream ran dry (session
                                               # 54's ramp off + tail 10: +3.2% but 8-16 of 640 streams underran)
    codec_tail_chunk: int = 10                 # a request's last <= chunk_frames frames before its length limit go
                                               # in chunks of this many (its final chunk then holds what is left
                                               # of one), decoded beside the talker's last steps rather than all
                                               # after them (codec_executor); 0: off. With codec_call_rows=16, H200
                                               # session 35 (5 against off): c=64 0.6B 671.7 -> 689.4, 1.7B 622.2
                                               # -> 648.1 audio-s/s; c=1 unchanged (HTTP 480.1 / 480.2 ms). 10 since
                                               # session 57 (with chunk_ramp_factor 2). The audio is the same
                                               # either way (one codec state per stream); on a CPU, whose codec is
                                               # synchronous, it only cuts that last chunk smaller
    codec_call_rows: int | None = 16           # most requests in one codec call: chunks due together go in calls
                                               # of this many, each collected when it lands (a burst's first
                                               # requests finish, and closed-loop clients send their next ones,
                                               # while the codec decodes the rest); None: one call per chunk size.
                                               # Alone: 0.6B c=64 681.4 (tail chunks alone 683.8), session 35
    codec_frames_per_step: int | None = 400    # most frames of regular chunks a step sends to the codec (the rest
                                               # wait a step or two; first and final chunks never, and are not
                                               # counted); None: no limit
    max_waiting: int = 1024                    # queue limit; add_request raises QueueFullError beyond it
    cuda_graphs: bool = True                   # on a GPU: the per-frame step (and the codec) as CUDA graphs
    capture_at_start: bool = True              # capture the decode graphs while starting, not on first use
    codec_dtype: str = "auto"                  # the codec decoder's precision: auto = fp16 on a GPU if the checkpoint
                                               # passes a check against fp32 (codec_precision.py), else fp32
    codec_max_batch: int | None = None         # most requests per codec call (its activations dominate memory)
    text_embedding_on_host: bool = True        # on a GPU: the talker's text embedding table (594 MiB in bf16) in host
                                               # memory; prompt builds gather new ids' rows there, no step reads it
                                               # (H200 session 21: 0.6B c=64 total 7.93 -> 7.34 GiB, same speed)
    preload_text_rows: bool = True             # on a GPU: every text token id's projected prompt row made at load
                                               # (vocab x hidden: 622 MB 1.7B, 311 MB 0.6B; qwen3_tts/text_rows.py),
                                               # so a prompt build never runs the projection (off: projected on a
                                               # text's first sight, kept up to 32768 ids). H200 session 25: a fresh
                                               # server's HTTP c=16 TTFP p50 73 -> 60 ms
    preload_text_ids: int = 16384              # on a GPU with preload_text_rows off (a tight memory budget): the
                                               # first N token ids' rows projected at load into the rows kept on
                                               # first sight (a BPE numbers its most frequent tokens first; N x
                                               # hidden: 32 MB at 0.6B), at most 16384 (half of them); 0: none.
                                               # H100 session 47, 0.6B c=64 over HTTP, three pairs: TTFP p99 128-135
                                               # ms against 160-208 (the first wave's builds), throughput the same
    codec_sms: int | str | None = "auto"       # on a GPU: the codec's kernels on this many SMs only (a CUDA green
                                               # context; sm_partition.py), the rest kept for the talker; "auto":
                                               # half (64 of an H200's 132: 0.6B c=64 664 -> 694 audio-s/s, H200
                                               # session 22) on GPUs of >= 100 SMs where green contexts exist,
                                               # else all; None: all. The driver rounds a count up (8s on Hopper)
    talker_high_priority: bool = False         # on a GPU: the talker's work on a highest-priority CUDA stream, ahead
                                               # of the codec's kernels (engine_stream.py; H200 session 8: no gain)
    kernels: bool = True                       # on a GPU: the fused Triton kernels (off: plain PyTorch everywhere)
    batch_prefill: bool = True                 # a step's prefill chunks in one forward (off: one request at a time)
    packed_prefill: bool = True                # with prefill graphs: a step's chunks end to end, unpadded, in one
                                               # replay (packed_prefill.py; H200 session 9: c=16 TTFP p99 135 ->
                                               # 95 ms, c=64 440 -> 457 audio-s/s; off: padded per-prompt graphs)
    prefill_graphs: bool | None = None         # whole-prompt prefills replayed from CUDA graphs (prefill_runner.py);
                                               # None: with cuda_graphs on a GPU. True on a CPU: the same padded
                                               # path, eagerly (tests)
    decode_before_prefill: bool = False        # a step queues its running streams' decode before its prefill
                                               # chunks, so the GPU decodes while the host builds the prefill (a
                                               # wave's new prompts took 0.35-1 ms of host time a chunk before the
                                               # decode's launch, H200 session 36 call 3); same outputs; off until
                                               # measured on the GPU
    prefill_stream: bool = False               # on a GPU: a step's prefill chunks on a CUDA stream of their own,
                                               # beside its decode instead of before it (prefill_lane.py: the new
                                               # requests' first decode, in the next step, waits for them); same
                                               # outputs; off until measured (~5% of a 0.6B c=64 run is the extra
                                               # time of its prefill steps, session 63)
    emit_while_waiting: bool = False           # while the host waits for the decode in flight, poll the codec: the
                                               # chunks that land (and the finals they complete) go out at once
                                               # through the engine process's or offline runner's driver, instead
                                               # of after the wait, at the step's end (the wait: ~5 ms of a 0.6B
                                               # c=64 step on a GPU); off until measured
    intake_while_waiting: bool = False         # while the host waits for the decode in flight, the engine
                                               # process takes the requests that arrived during the step (their
                                               # prompts built then, scheduled in the next step) rather than after
                                               # the step, when the GPU has run dry; same outputs; off until measured
    eager_first_chunk: int = 4                 # up to this many running requests, a first chunk launched in a
                                               # step is waited for in the next, right after that step's decode is
                                               # queued (0: never; it is collected when it lands)
    warmup_requests: bool | None = None        # run the model's warm-up requests before serving (None: on a GPU
                                               # with capture_at_start, where first use compiles kernels)
    trace_steps: str | None = None             # append one JSON line per step to this file (step_trace.py)
    trace_profile_prepare: bool = False        # with trace_steps: also cProfile the prompt builds (slows them)
    add_seconds_per_step: float | None = None  # while streams run, new requests taken until their prompt builds
                                               # took this long, then a step (None: every arrival at once;
                                               # engine/inprocess.py: off, it cost c=64 throughput on the H200)
    idle_spin_ms: float = 0.0                  # the serving engine process (engine/process.py), idle after its
                                               # last work, polls for requests without sleeping this long before
                                               # it blocks: a request arriving then finds its core awake; 0: off
                                               # (20 ms over HTTP c=1, H200 session 35: 480.5 -> 479.6 ms E2E on
                                               # one machine, 480.1 on another: noise for a busy core)
