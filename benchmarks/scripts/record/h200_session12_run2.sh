#!/usr/bin/env bash
# Session 12, call 2 (carry [".whl"]): decode batches with the norms folded into the GEMMs on tensor cores
# (voxflow/kernels/norm_linear_batch.py, qwen3_layer.BATCH_NORM_LINEAR, VOXFLOW_BATCH_NORM_LINEAR=1):
#  1. GPU tests: the batch kernel at the real widths (16 / 64 / 200 rows, fp32 and bf16, config overrides), the
#     engine with it on == the CPU reference (12 requests), the one-row path's engine test (its spy renamed);
#  2. tune_norm_linear_batch.py at 16 / 64 / 256 rows: fused vs the launches it replaces, candidate configs;
#  3. profile_step c=64,256 default vs VOXFLOW_BATCH_NORM_LINEAR=1;
#  4. HTTP c=64 (256 prompts) with it on (call 1 of this session has the default: 472.5 audio-s/s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 170 tests/gpu/test_gpu_cp_layer.py -k "batch" \
  "tests/gpu/test_gpu_engine.py::test_gpu_batch_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference"
timeout 120 python3 benchmarks/scripts/tune_norm_linear_batch.py 16,64,256 > $R/tune_norm_linear_batch.txt 2>&1
grep -v "^  {" $R/tune_norm_linear_batch.txt | cut -c1-200
wait $CK
for v in default bnl; do
  [ $v = bnl ] && export VOXFLOW_BATCH_NORM_LINEAR=1
  timeout 110 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_64_256_$v.txt
  echo "$v:"; grep -E "ms per step|kernels per step" $R/profile_step_64_256_$v.txt
  unset VOXFLOW_BATCH_NORM_LINEAR
done
if [ $SECONDS -lt 470 ]; then
  export VOXFLOW_BATCH_NORM_LINEAR=1
  if serve_variant bnl; then
    bench_http --label http-bnl --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_bnl.json
  fi
  stop_server bnl
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
