#!/usr/bin/env bash
# Session 50, the call left after nine failed starts (374 s of device time); carry [".whl", ".device_tree"]. ~120 s.
# fp8 KV pages (kv_cache_dtype=fp8): their GPU tests (decode kernel both variants at the talker's shapes, the new
# token appended in the queries' dtype; tiled prefill), then one step's 28 layers of decode attention at 0.6B c=64
# shapes, bf16 against fp8 pages and fp8 at other tiles (probe_kv_fp8.py, alternating). The served A/B waits for
# h200_next_run1.sh in a later session.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
[ -n "${PROBE_ONLY:-}" ] || gpu_tests 100 tests/gpu/test_gpu_paged_attention.py tests/gpu/test_gpu_paged_prefill.py \
  -k "fp8 or dtype2"
pack_results
timeout 80 python3 benchmarks/scripts/probe_kv_fp8.py 64 171 2>&1 | grep -v -i warn | tee $R/probe_kv_fp8.txt
pack_results
echo "done at ${SECONDS}s"
