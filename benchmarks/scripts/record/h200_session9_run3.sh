#!/usr/bin/env bash
# Session 9, call 3 (carry [".whl"]): the targets not re-run since session 6 with today's defaults (packed prefill,
# kept text rows), and where c=1 and c=256 steps go:
#  1. HTTP c=1 (TTFP, RTF: the packed prefill is the default now);
#  2. profile_step.py at c=1 (with the eager split by stage) and c=256;
#  3. offline 1.7B c=256 (best concurrency), fp32/TF32 codec and bf16 codec;
#  4. offline 0.6B c=64 in the <= 8 GB configuration (2 GB KV pool, bf16 codec, codec calls of <= 16 requests).
# Each step has its own timeout and is skipped when the call's 560 s would not hold it.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --device cuda"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B | tail -1 &
ck=$!
if serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 4 --num-warmups 1 --output $R/h200_1p7b_http_c1.json
fi
stop_server default
timeout 170 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,256 2>&1 | grep -v Warn > $R/profile_step_1_256.txt
grep -E "per step|ms/step" $R/profile_step_1_256.txt | head -6
wait $ck
for codec in fp32 bf16; do
  [ $SECONDS -gt 420 ] && { echo "skip c=256 $codec at ${SECONDS}s"; continue; }
  extra=(); [ $codec = bf16 ] && extra=(--engine-arg codec_dtype=bfloat16)
  timeout 110 python3 -m voxflow.bench $common --model /tmp/real-1.7b --label offline-$codec "${extra[@]}" \
    --concurrency 256 --num-prompts 512 --num-warmups 8 --max-num-seqs 256 \
    --output $R/h200_1p7b_offline_c256_$codec.json 2>&1 | grep -v "^\s*$" | tail -2
done
if [ $SECONDS -lt 480 ]; then
  timeout 80 python3 -m voxflow.bench $common --model /tmp/real-0.6b --label small-8gb --engine-arg codec_dtype=bfloat16 \
    --engine-arg codec_max_batch=16 --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 \
    --num-warmups 8 --max-num-seqs 64 --output $R/h200_0p6b_offline_c64.json 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
