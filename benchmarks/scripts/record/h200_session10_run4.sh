#!/usr/bin/env bash
# Session 10, call 4 (carry [".whl"]): programmatic dependent launch WITHOUT the weight prefetch (VOXFLOW_PDL=1
# VOXFLOW_PDL_PREFETCH=0). Call 3's tune_pdl.py at one row: a frame's code-predictor predict 2195.9 -> 1941.4 us
# with it (with the prefetch, call 1: 2198.3 -> 2135.9).
#  1. GPU tests with the prefetch off: PDL on == off bit for bit (test_gpu_pdl.py), the engine with PDL == the CPU
#     reference;
#  2. HTTP c=1 (8 prompts) and c=8 (32 prompts): PDL off (default) vs on without the prefetch;
#  3. the c=1 step profile with it.
# Decide: PDL on by default on Hopper, the prefetch removed, if c=1 RTF improves and c=8 is not worse.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
VOXFLOW_PDL_PREFETCH=0 timeout 200 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_pdl.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_with_programmatic_dependent_launch_equals_cpu_reference" \
  > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -6
wait $ck
export VOXFLOW_PDL_PREFETCH=0
for variant in pdloff pdlnp; do
  [ $variant = pdlnp ] && export VOXFLOW_PDL=1
  if serve_variant $variant; then
    bench_http --label http-$variant --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_$variant.json
    bench_http --label http-$variant --concurrency 8 --num-prompts 32 --num-warmups 2 --output $R/h200_1p7b_http_c8_$variant.json
  fi
  stop_server $variant
done
[ $SECONDS -lt 480 ] && timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_1_pdl_noprefetch.txt
grep -E "per step|by stream" $R/profile_step_1_pdl_noprefetch.txt
unset VOXFLOW_PDL VOXFLOW_PDL_PREFETCH
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
