#!/usr/bin/env bash
# Ran on tree 2899e61 in 198 s. Its VOXFLOW_BATCH_SKINNY switch and the batch_skinny GPU test were removed in ecb2178;
# its benches ran before device_lib.sh made --unique-prompts the default (UNIQUE= set empty reruns them as they ran).
# Session 25 call 1. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 400 s.
# 1. GPU tests: the codec partition's (incl. the corrected teardown test: frames freed after their partitioned
#    runner, never run on a GPU yet), the batch skinny GEMMs' engine test (voxflow/layers/batch_linear.py, switch
#    on: fp32 codes == CPU loop) and skinny_linear at 64 rows.
# 2. 0.6B c=64 (<= 8 GB configuration) step profile with VOXFLOW_BATCH_SKINNY=0 / 1: the 9..64-row GEMMs on cuBLAS
#    against skinny_linear with PDL (session 24 call 5: cuBLAS GEMMs 2.82 of 5.68 ms a step).
# 3. tune_skinny_linear.py at 16 / 64 rows on the code predictor's shapes (the 0.6B talker's are the same): the
#    heuristic's config against its neighbours, bare and with the residual.
# 4. A fresh 1.7B model's prompt builds of the bench's 64 prompts, first sight against second, cProfile
#    (profile_prepare_cold.py): why a fresh server's first HTTP c=16 run is ~2x slower at p99 (session 24 call 6).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_skinny_linear.py \
  -k "partition or partitioned or batch_skinny or 64"
wait $CK6
for on in 0 1; do
  VOXFLOW_BATCH_SKINNY=$on timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 --no-eager \
    codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v Warn > $R/profile_step_0p6b_64_skinny$on.txt
  head -24 $R/profile_step_0p6b_64_skinny$on.txt
  echo "  at ${SECONDS}s"
done
pack_results
timeout 120 python3 benchmarks/scripts/tune_skinny_linear.py --rows 16,64 --only cp --budget 90 --verbose \
  > $R/tune_skinny_linear_rows_16_64.txt 2>&1
grep -v "^    " $R/tune_skinny_linear_rows_16_64.txt
pack_results
wait $CK
timeout 120 python3 benchmarks/scripts/profile_prepare_cold.py /tmp/real-1.7b 64 cuda > $R/prepare_cold_1p7b.txt 2>&1
head -12 $R/prepare_cold_1p7b.txt
echo "done at ${SECONDS}s"
