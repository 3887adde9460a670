#!/usr/bin/env bash
# Prepared in session 10 (device time spent) for the next session's first call, carry [".whl"]:
#  1. GPU test: the engine with qwen3_layer.ONE_ROW_NORM_LINEAR on (one request: the talker's one-row layers with
#     their norms folded into q|k|v and gate|up) == the CPU reference;
#  2. tune_talker_one_row.py: norm_linear at the talker's widths vs rms_norm + cuBLAS, and the one-row layer step
#     off / on;
#  3. HTTP c=1 (8 prompts): default vs VOXFLOW_ONE_ROW_NORM_LINEAR=1 (c=1 RTF 0.052 in session 10; 0.04 is the
#     target);
#  4. HTTP c=64: default vs add_seconds_per_step=0.004 / 0.008 (prompt builds paced over steps: session 7 measured
#     it worse with the padded prefill; the packed prefill makes a step's prefill one replay).
#  5. profile_prepare.py: where a prompt build's host time goes now (batched or host-assembled prompt builds next?).
# Decide: ONE_ROW_NORM_LINEAR on by default if c=1 RTF improves; pacing on at the value that raises c=64
# throughput without a worse TTFP p99.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 150 "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
timeout 120 python3 benchmarks/scripts/tune_talker_one_row.py --budget 50 > $R/tune_talker_one_row.txt 2>&1
grep -v Warn $R/tune_talker_one_row.txt | tail -12
wait $CK
# where a prompt build's ~1-1.4 ms (a c=64 wave: ~90 ms of them while few streams decode) goes now, on the GPU host
timeout 60 python3 benchmarks/scripts/profile_prepare.py /tmp/real-1.7b 2>&1 | grep -v Warn > $R/profile_prepare.txt
head -1 $R/profile_prepare.txt
for variant in default onerow; do
  [ $variant = onerow ] && export VOXFLOW_ONE_ROW_NORM_LINEAR=1
  if serve_variant $variant; then
    bench_http --label http-$variant --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_$variant.json
    [ $variant = default ] && bench_http --label http-$variant --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_$variant.json
  fi
  stop_server $variant
  unset VOXFLOW_ONE_ROW_NORM_LINEAR
done
for pace in 0.004 0.008; do
  [ $SECONDS -gt 470 ] && { echo "skip pace $pace at ${SECONDS}s"; continue; }
  if serve_variant pace$pace --engine-arg add_seconds_per_step=$pace; then
    bench_http --label http-pace$pace --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_pace$pace.json
  fi
  stop_server pace$pace
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
