#!/usr/bin/env bash
# Prepared in session 37 (no device was lent that session); carry [".whl", ".device_tree"]. Rename to
# h200_sessionNN_runK.sh when run. ~300 s.
# The codec graphs captured largest first (codec_runner.warmup_shapes; before, smallest first): session 28 call 5's
# probe found the 0.6B codec graphs' pool at 1,342 MiB reserved in 38 segments for 135 MiB allocated, and the
# sub-pixel transposed convolutions (VOXFLOW_CODEC_SUBPIXEL=1: 7% less codec kernel time, 0.6B c=64 686 -> 703
# audio-s/s) 746 MiB more, past the 8 GB budget (7.97 GiB). This call: the codec GPU tests (the new one: every
# engine shape's warm-up reserves about what the largest graph alone does), the allocation probe (pool sizes after
# startup and while serving), 0.6B c=64 (<= 8 GB) on the defaults and with sub-pixel convolutions, footprints
# printed (does sub-pixel now fit?), and the probe with sub-pixel. Also in this tree: the prefill graphs keep only a
# row per chunk as their output (prefill_runner.GraphedPrefill; before, each of the 0.6B's 74 packed graphs kept its
# whole [T, H] hidden state: 205 MiB), held by test_gpu_packed_prefill_equals_cpu_reference; and a step's new
# requests attached together (SlotTable.load_many), held by the no-hidden-sync and frame-input GPU tests.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 240 tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py \
  tests/gpu/test_gpu_frame_input.py -k "warmup or graph_path_equals or packed_prefill or synchronisation or frame_input"
pack_results
wait $CK6
probe_small_allocations
bench_small_traced defaults
(export VOXFLOW_CODEC_SUBPIXEL=1; bench_small_traced subpixel)
pack_results
(export VOXFLOW_CODEC_SUBPIXEL=1; python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 \
  kv_cache_bytes=2400000000 codec_max_batch=16 2>&1 | grep -v Warning > $R/probe_allocations_subpixel.txt)
grep -A9 "^==" $R/probe_allocations_subpixel.txt | head -20
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
echo "done at ${SECONDS}s"
