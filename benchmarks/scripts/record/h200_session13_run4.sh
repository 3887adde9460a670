#!/usr/bin/env bash
# (Ran on tree 550423b; the paged decode minimum chunk (d00526d) was reverted after it, and tune_paged_decode.py went back to its call-3 form: its --sweep / old-vs-new columns are in 550423b.)
# Session 13, call 4 (carry [".whl"]): the paged decode's minimum chunk length (default_min_split_tokens: a short
# context in a big batch uses fewer splits; a row that fits one chunk is written by its first program).
#  1. GPU tests: paged attention at the real shapes (its default launch now has the minimum), the engine's fp32
#     graphs + kernels and 12-request tests == the CPU reference;
#  2. tune_paged_decode.py: old (min 0) vs new default over rows 1-256 and contexts 64-1024, and a sweep at 64 / 256;
#  3. tune_cp_attention.py: the code predictor's attention core at 1-256 rows, 1 / 2 / 4 / 8 warps a program;
#  4. profile_step c=64 / 256 (call 2, same tree otherwise: 9.09 / 20.57 ms), HTTP c=64 (256 prompts).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 100 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
timeout 60 python3 benchmarks/scripts/tune_paged_decode.py --rows 1,8,64,256 --contexts 64,128,256,1024 2>&1 \
  | grep -v Warn > $R/tune_paged_decode.txt
timeout 70 python3 benchmarks/scripts/tune_paged_decode.py --rows 64,256 --contexts 64,128,256 --sweep 2>&1 \
  | grep -v Warn > $R/tune_paged_decode_sweep.txt
cat $R/tune_paged_decode.txt; tail -7 $R/tune_paged_decode_sweep.txt
timeout 40 python3 benchmarks/scripts/tune_cp_attention.py --rows 1,16,64,256 2>&1 | grep -v Warn \
  > $R/tune_cp_attention.txt
cat $R/tune_cp_attention.txt
wait $CK
timeout 90 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_256.txt
grep -E "ms per step|kernels per step" $R/profile_step_64_256.txt | cut -c1-90
echo "profile done at ${SECONDS}s"
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
echo "done at ${SECONDS}s"
