#!/usr/bin/env bash
# Session 12, call 3 (carry [".whl"]): programmatic dependent launch on the remaining decode kernels (qk_norm_rope,
# paged decode + its split merge, select_tokens, the code predictor's attention at > 1 row), on by default:
#  1. GPU tests: the engine's codes / audio equal with PDL on and off (bf16, 1 and 12 requests), the PDL module's
#     tests, paged attention, qk_norm_rope, select_tokens, dense attention;
#  2. profile_step c=1,64 (call 1, tree 19954ee: 3.63 / 9.19 ms a step);
#  3. HTTP c=1 (8 prompts) and c=64 (256 prompts) (call 1: RTF 0.047, 472.5 audio-s/s);
#  4. tune_causal_conv.py fp32 at 16 streams x 25 frames with 4 more candidates (the codec call timed before/after).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 200 "tests/gpu/test_gpu_engine.py::test_gpu_engine_codes_equal_with_pdl_on_and_off" \
  tests/gpu/test_gpu_pdl.py tests/gpu/test_gpu_paged_attention.py tests/gpu/test_gpu_qk_norm_rope.py \
  tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_dense_attention.py
wait $CK
timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64.txt
grep -E "ms per step|kernels per step" $R/profile_step_1_64.txt
if serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_default.json
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
if [ $SECONDS -lt 440 ]; then
  timeout $((570 - SECONDS)) python3 benchmarks/scripts/tune_causal_conv.py 16 25 float32 > $R/tune_causal_conv.txt 2>&1
  grep -E "^BEST|codec|with the" $R/tune_causal_conv.txt
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
