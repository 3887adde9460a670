#!/usr/bin/env bash
# RAN in session 9 as call 2; the batch form it measured was slower and was reverted (VOXFLOW_CP_BATCH_MIN_ROWS and
# the batch sweeps of tune_cp_layer.py went with it): kept as the record of what ran.
# Session 9, call 2 (carry [".whl"]): the code predictor's batch form (cp_layer._batch_step: five kernels a layer
# step with norm_linear's new tensor-core kernel) at c=16 / c=64.
#  1. GPU tests: the cp layer at 1..64 rows (kernels, whole layer, CUDA graph, predict on vs off), the tiled prefill
#     kernel with its corrected bf16 bound, the engine with packed and padded prefill;
#  2. tune_cp_layer.py at 1, 16, 64 rows: the batch kernels' configs against what they replace, a frame's layer
#     steps and predict() with the fused layers off / on;
#  3. HTTP A/B in one call: batch form off (VOXFLOW_CP_BATCH_MIN_ROWS=65) vs on (the default), c=16 with 128
#     prompts and c=64 with 256 prompts, step traces.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 240 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_cp_layer.py \
  tests/gpu/test_gpu_paged_prefill.py "tests/gpu/test_gpu_engine.py::test_gpu_packed_prefill_equals_cpu_reference" \
  > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -8
timeout 150 python3 benchmarks/scripts/tune_cp_layer.py --rows 1,16,64 --budget 90 > $R/tune_cp_layer.txt 2>&1
grep -v Warn $R/tune_cp_layer.txt | tail -14
wait $ck
for variant in batchoff default; do
  [ $variant = batchoff ] && export VOXFLOW_CP_BATCH_MIN_ROWS=65
  if serve_variant $variant; then
    bench_http --label http-$variant --concurrency 16 --num-prompts 128 --num-warmups 8 \
      --output $R/h200_1p7b_http_c16_$variant.json
    bench_http --label http-$variant --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_$variant.json
  fi
  stop_server $variant
  unset VOXFLOW_CP_BATCH_MIN_ROWS
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
