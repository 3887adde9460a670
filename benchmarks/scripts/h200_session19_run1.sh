#!/usr/bin/env bash
# Prepared at the end of session 18; ran as session 19 call 1 (the record of that call;
# the text below is as prepared). `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl",
# ".device_tree"]; the results come back as one archive, r.tgz (a call returns 8 files at most). About 520 s:
#  1. GPU tests of the paged decode: the TF32 rounding (4f4d045) and the 64-row graph replay came after the last GPU
#     run; the fp32 engine == the CPU reference with the tensor-core variant forced on;
#  2. HTTP c=64 with the defaults (the target's workload, on another machine than session 18's);
#  3. offline 0.6B c=64 <= 8 GB: the 2 GB pool with kv_reserve_frames=151, then a 3 GB pool (21 preemptions a run
#     with 2 GB and no reservation: session 18's README);
#  4. offline c=256 (the best-concurrency target; the paged decode was 2.2 ms of its 14.3 ms step).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 70 tests/gpu/test_gpu_paged_attention.py
VOXFLOW_PAGED_DECODE_TC=1 timeout 50 python3 -m pytest -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  > $R/gpu_tests_engine_tc.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests_engine_tc.txt | tail -3
wait $CK
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
wait $CK6
bench_small_8gb reserve --engine-arg kv_reserve_frames=151 --engine-arg trace_steps=$R/steps_0p6b_reserve.jsonl
bench_small_8gb kv3gb --engine-arg kv_cache_bytes=3000000000 --engine-arg trace_steps=$R/steps_0p6b_kv3gb.jsonl
gzip -f $R/steps_0p6b_*.jsonl
[ $SECONDS -lt 420 ] && bench_offline default
echo "done at ${SECONDS}s"
