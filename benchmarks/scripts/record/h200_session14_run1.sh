#!/usr/bin/env bash
# Prepared in session 13 (its device time spent) for the next session's first call, carry [".whl"]: the code
# predictor's attention core at one warp a program from 64 rows on (dense_decode_norm_rope.ONE_WARP_FROM_ROWS, off
# by default; session 13 call 4: 256 rows 22.2 -> 10.4 us a call, 64 rows 8.7 -> 7.2).
#  1. GPU tests with it on: the attention kernels, the code predictor's layer and predict paths, the engine's
#     12-request and PDL tests == the CPU reference;
#  2. profile_step c=64 / 256 with it on and off;
#  3. HTTP c=64 with it on (session 12: 468.0-472.5 audio-s/s; session 13 call 4's other tree: 447.4), and
#     offline c=256 (session 12: 766.5).
# If it wins and the tests pass: ONE_WARP_FROM_ROWS = 64 by default (and the README / results table).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
export VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS=64
gpu_tests 150 tests/gpu/test_gpu_dense_attention.py tests/gpu/test_gpu_cp_layer.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_codes_equal_with_pdl_on_and_off"
wait $CK
for v in onewarp default; do
  [ $v = default ] && unset VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS
  timeout 80 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_64_256_$v.txt
  echo "$v: $(grep -E 'ms per step' $R/profile_step_64_256_$v.txt | cut -c1-40 | tr '\n' ' ')"
done
export VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS=64
if serve_variant onewarp; then
  bench_http --label http-onewarp --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_onewarp.json
fi
stop_server onewarp
[ $SECONDS -lt 430 ] && timeout 120 python3 -m voxflow.bench --model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 \
  --ignore-eos --no-progress --no-plots --label offline-onewarp --concurrency 256 --num-prompts 512 --num-warmups 8 \
  --max-num-seqs 256 --output $R/h200_1p7b_offline_c256_onewarp.json 2>&1 | grep -v "^\s*$" | tail -2
echo "done at ${SECONDS}s"
