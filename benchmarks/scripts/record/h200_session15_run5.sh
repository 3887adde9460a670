#!/usr/bin/env bash
# Session 15, call 5 (carry [".whl"]): the GPU tests that build engines, now that the codec's GPU default is fp16
# (codec_dtype=auto) and the runner zeroes NaN chunks: the engine against the CPU loop (codec pinned to fp32 there),
# PDL on / off, slot growth, no hidden host synchronisation (engines with the default codec); then HTTP c=16
# with the defaults (target: TTFP p99 <= 100 ms, no underruns; session 12: 82 ms with the fp32 codec).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 250 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py
echo "tests done at ${SECONDS}s"
wait $CK
if [ $SECONDS -lt 380 ] && serve_variant c16; then
  bench_http --label http-auto-c16 --concurrency 16 --num-prompts 64 --num-warmups 2 \
    --output $R/h200_1p7b_http_c16_auto.json
fi
stop_server c16
echo "done at ${SECONDS}s"
