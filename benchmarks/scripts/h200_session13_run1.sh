#!/usr/bin/env bash
# Prepared in session 12 (its device time spent) for the next session's first call, carry [".whl"]:
#  1. the GPU tests session 12's last call could not fit in its 100 s: test_gpu_select_tokens.py and test_gpu_pdl.py
#     after the draws' embedding-row copy, and the whole of test_gpu_engine.py;
#  2. profile_step c=1,64 and HTTP c=1 / c=64 on the tree as it stands (session 12: 3.51 ms, RTF p50 0.045;
#     9.19 ms, 468.0-472.5 audio-s/s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 240 tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_pdl.py tests/gpu/test_gpu_engine.py
wait $CK
timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64.txt
grep -E "ms per step|kernels per step" $R/profile_step_1_64.txt
if serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_default.json
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
