#!/usr/bin/env bash
# Session 15, call 4 (carry [".whl"]): the new default codec_dtype=auto (fp16 on a GPU after the load-time check
# against fp32) with fp16's own tuned convolution configs:
#  1. every GPU codec test (incl. auto picking fp16 at the real size);
#  2. offline 1.7B c=256 with the defaults (call 3 on another machine: fp16 968.9 vs fp32 839.7);
#  3. HTTP 1.7B c=64 and c=1 with the defaults (session 14: 462.4-479.0, c=1 TTFP 14 / 16 ms, RTF 0.045);
#  4. offline 0.6B c=64 in the <= 8 GB configuration (2 GB KV pool, codec calls of <= 16 requests; the codec by
#     default now, fp16; session 12 with the bf16 codec: 457.8 audio-s/s, 5.6 GiB).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
gpu_tests 170 tests/gpu/test_gpu_codec.py
echo "tests done at ${SECONDS}s"
wait $CK
bench_offline auto
if serve_variant auto; then
  grep -o "codec_precision.\{0,220\}" $R/serve_log_auto.txt | head -1
  bench_http --label http-auto --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_auto.json
  [ $SECONDS -lt 420 ] && bench_http --label http-auto-c1 --concurrency 1 --num-prompts 12 --num-warmups 2 \
    --output $R/h200_1p7b_http_c1_auto.json
fi
stop_server auto
wait $CK6
if [ $SECONDS -lt 480 ]; then
  timeout 90 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-0.6b --label small-8gb-auto --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
    --output $R/h200_0p6b_offline_c64_auto.json 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
