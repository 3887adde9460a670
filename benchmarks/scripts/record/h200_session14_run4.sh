#!/usr/bin/env bash
# Session 14, call 4 (carry [".whl"]), the session's final tree:
#  1. GPU tests: dense attention (the normed query / key rule: one ulp of the result + one ulp at 1.0), the codec
#     (graph path == eager, async == sync, fused kernels == plain torch; the pool's states now packed), the engine's
#     fp32 12-request and PDL tests == the CPU reference;
#  2. profile_codec.py 16 fp32: the pool's gather / write-back now one kernel per dtype (call 2: 37 index_select
#     + 37 index_copy, ~0.63 ms of a 16 x 25-frame call's 16.97 ms, ~0.63 of a 1-frame call's 3.19);
#  3. conv_epilogue_cost.py fp32 with the persistent launches (loop / flat) next to the default; profile_codec.py
#     with VOXFLOW_CONV_PERSISTENT=flat;
#  4. HTTP c=64, offline c=256, HTTP c=1 (the README's rows).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_dense_attention.py tests/gpu/test_gpu_codec.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_codes_equal_with_pdl_on_and_off"
echo "tests done at ${SECONDS}s"
wait $CK
timeout 60 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32 > $R/conv_epilogue_cost.txt 2>&1
cat $R/conv_epilogue_cost.txt
timeout 70 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp32 2>&1 | grep -v Warn > $R/profile_codec_16.txt
grep -E "per call" $R/profile_codec_16.txt
VOXFLOW_CONV_PERSISTENT=flat timeout 70 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp32 2>&1 \
  | grep -v Warn > $R/profile_codec_16_flat.txt
grep -E "per call" $R/profile_codec_16_flat.txt
echo "codec done at ${SECONDS}s"
if serve_variant final; then
  bench_http --label http-final --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_final.json
  [ $SECONDS -lt 440 ] && bench_http --label http-final-c1 --concurrency 1 --num-prompts 12 --num-warmups 2 \
    --output $R/h200_1p7b_http_c1_final.json
fi
stop_server final
[ $SECONDS -lt 430 ] && timeout 110 python3 -m voxflow.bench --model /tmp/real-1.7b --device cuda --dtype bfloat16 \
  --max-new-tokens 151 --ignore-eos --no-progress --no-plots --label offline-final --concurrency 256 --num-prompts 512 \
  --num-warmups 8 --max-num-seqs 256 --output $R/h200_1p7b_offline_c256_final.json 2>&1 | grep -v "^\s*$" | tail -2
echo "done at ${SECONDS}s"
