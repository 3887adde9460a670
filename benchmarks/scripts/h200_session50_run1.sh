#!/usr/bin/env bash
# Session 50, call 1; carry [".whl", ".device_tree"]. ~450 s, cut at the call's limit (machines scarce: eight starts failed; 554 s of device time left).
# The talker's KV pages in fp8 (EngineConfig.kv_cache_dtype=fp8, e4m3 unscaled; model_api.pool_spec): half the bytes
# a position, so decode attention (which reads every row's whole context each step: ~1.8 GB a 0.6B c=64 step in
# bf16, more than the talker's weights) reads half, and a 1.4 GB pool holds what the 2.4 GB bf16 one does (which
# preempts 3-8 requests a run). Built and tested on the CPU (interpreter cases of both kernels). Here: its GPU tests
# (decode kernel both variants, tiled prefill); the 28 layers' attention of one step, bf16
# against fp8 (probe_kv_fp8.py, alternating); then 0.6B c=64 <= 8 GB offline: fp8 1.4 GB (the first run: compiles),
# bf16 2.4 GB, fp8 1.4 GB.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 150 tests/gpu/test_gpu_paged_attention.py tests/gpu/test_gpu_paged_prefill.py -k "fp8 or dtype2"
timeout 90 python3 benchmarks/scripts/probe_kv_fp8.py 64 171 2>&1 | grep -v -i warn | tee $R/probe_kv_fp8.txt
pack_results
wait $CK6
bench_small_first fp8_0 --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000   # (compiles)
pack_results
bench_small_traced off_1
pack_results
bench_small_traced fp8_1 --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000
pack_results
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
