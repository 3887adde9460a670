#!/usr/bin/env bash
# Session 19, call 1 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive
# back, r.tgz). About 560 s. A record: decode_branches (9b589cc) was removed after this call (the session README).
#  1. GPU tests: the paged decode after the TF32 rounding (4f4d045) and its 64-row graph replay (never run on a GPU);
#     decode_branches (9b589cc) in fp32 against the CPU reference; attention_o_proj on two streams at once; the fp32
#     engine with the tensor-core variant forced on;
#  2. profile_step A/B of decode_branches: 1.7B at c=64 and 256 with 1, 2 and 3 branches; 0.6B c=64 (<= 8 GB
#     configuration) with 1 and 2;
#  3. time permitting, HTTP c=64 with 2 branches (session 18's default runs: 635.4 and 592.1 on two machines).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 110 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_decode_branches_equal_cpu_reference" \
  "tests/gpu/test_gpu_cp_layer.py::test_attention_o_proj_on_two_streams_at_once_equals_each_alone"
VOXFLOW_PAGED_DECODE_TC=1 timeout 50 python3 -m pytest -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  > $R/gpu_tests_engine_tc.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests_engine_tc.txt | tail -3
echo "tests done at ${SECONDS}s"
profile() {   # LABEL SECONDS MODEL LEVELS [KEY=VALUE...]
  local label=$1 seconds=$2; shift 2
  timeout "$seconds" python3 benchmarks/scripts/profile_step.py "$@" --no-eager 2>&1 | grep -v Warn \
    > "$R/profile_step_$label.txt"
  grep -E "ms per step" "$R/profile_step_$label.txt" | cut -c1-90
}
wait $CK
profile 1p7b_branches1 240 /tmp/real-1.7b 64,256          # the first profile of a call pays Triton's JIT
profile 1p7b_branches2 120 /tmp/real-1.7b 64,256 decode_branches=2
profile 1p7b_branches3 120 /tmp/real-1.7b 64,256 decode_branches=3
echo "1.7B profiles done at ${SECONDS}s"
wait $CK6
SMALL="kv_cache_bytes=2000000000 codec_max_batch=16"
profile 0p6b_branches1 90 /tmp/real-0.6b 64 $SMALL
profile 0p6b_branches2 90 /tmp/real-0.6b 64 $SMALL decode_branches=2
echo "0.6B profiles done at ${SECONDS}s"
if [ $SECONDS -lt 450 ] && serve_variant branches2 --engine-arg decode_branches=2; then
  bench_http --label http-branches2 --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_branches2.json.gz
fi
stop_server branches2
echo "done at ${SECONDS}s"
