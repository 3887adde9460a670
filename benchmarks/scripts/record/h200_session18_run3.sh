#!/usr/bin/env bash
# Session 18, call 3 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree",
# "benchmarks/scripts/.baseline_pda.py"] with .baseline_pda.py = `git show 25804f1:voxflow/kernels/
# paged_decode_attention.py`, the kernel before the tensor-core variant; results come back as one archive, r.tgz):
#  1. GPU tests: the paged decode's tensor-core variant (real shapes, short contexts with the new token, a 48-row
#     graph replay), and the fp32 engine == the CPU reference with the variant forced on (VOXFLOW_PAGED_DECODE_TC=1);
#  2. tune_paged_decode.py --tc at 64 / 256 rows beside the baseline module;
#  3. profile_step c=64: the default (tensor cores from B * Hkv >= SMs) vs VOXFLOW_PAGED_DECODE_TC=0, one machine;
#  4. HTTP c=64 with the defaults.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
trap 'tar czf $OUT/r.tgz -C /tmp r' EXIT TERM
real_checkpoint_bg
VOXFLOW_PAGED_DECODE_TC=1 timeout 60 python3 -m pytest -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference" > $R/gpu_tests_engine_tc.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests_engine_tc.txt | tail -4
gpu_tests 80 -x tests/gpu/test_gpu_paged_attention.py
echo "tests done at ${SECONDS}s"
timeout 100 python3 benchmarks/scripts/tune_paged_decode.py --tc --baseline benchmarks/scripts/.baseline_pda.py \
  --rows 64,256 --contexts 64,128,192,384,1024 2>&1 | grep -v Warn > $R/tune_paged_decode_tc.txt
cut -c1-150 $R/tune_paged_decode_tc.txt
echo "tune done at ${SECONDS}s"
wait $CK
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_default.txt
VOXFLOW_PAGED_DECODE_TC=0 timeout 60 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_cuda_cores.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_cuda_cores.txt
echo "profiles done at ${SECONDS}s"
if [ $SECONDS -lt 440 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "done at ${SECONDS}s"
