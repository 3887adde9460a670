#!/usr/bin/env bash
# Session 17, call 2 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]): the code
# predictor's layers above the skinny sizes with both RMSNorms folded into the GEMM weights and the residual adds in
# the GEMMs (voxflow/layers/folded_norms.py, qwen3_layer.FOLDED_NORMS, VOXFLOW_FOLDED_NORMS=0 turns it off):
#  1. the GPU tests it touches (the folded predict at 64 rows on vs off, the attention core, silu * up, the q/k
#     norm helper, the fp32 engine above the skinny sizes == the CPU reference);
#  2. profile_step c=64 / 256 with it on and off (A/B on one machine);
#  3. HTTP c=64 with it on and off.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_dense_attention.py \
  tests/gpu/test_gpu_kernels_elementwise.py tests/gpu/test_gpu_qk_norm_rope.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
wait $CK
timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_256_folded.txt
grep -E "ms per step" $R/profile_step_64_256_folded.txt
VOXFLOW_FOLDED_NORMS=0 timeout 90 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_256_unfolded.txt
grep -E "ms per step" $R/profile_step_64_256_unfolded.txt
echo "profiles done at ${SECONDS}s"
if [ $SECONDS -lt 400 ] && serve_variant folded; then
  bench_http --label http-folded --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_folded.json.gz
fi
stop_server folded
export VOXFLOW_FOLDED_NORMS=0
if [ $SECONDS -lt 490 ] && serve_variant unfolded; then
  bench_http --label http-unfolded --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_unfolded.json.gz
fi
stop_server unfolded
unset VOXFLOW_FOLDED_NORMS
echo "done at ${SECONDS}s"
