#!/usr/bin/env bash
# Session 12, call 4 (carry [".whl"]): the targets not re-run since sessions 9-10, with today's defaults (PDL on
# every decode kernel, the retuned codec convolutions):
#  1. HTTP c=16 (64 prompts = 4 waves): TTFP p99 <= 100 ms, no underruns (session 10: 92 ms);
#  2. offline 1.7B c=256 (best concurrency), fp32/TF32 codec and bf16 codec (session 9-10: 717.9-731.0; bf16 795.2);
#  3. offline 0.6B c=64 in the <= 8 GB configuration (2 GB KV pool, bf16 codec, codec calls of <= 16 requests;
#     session 9: 466.5 audio-s/s, 5.6 GiB).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --device cuda"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B | tail -1 &
ck=$!
if serve_variant default; then
  bench_http --label http-default --concurrency 16 --num-prompts 64 --num-warmups 2 --output $R/h200_1p7b_http_c16.json
fi
stop_server default
for codec in fp32 bf16; do
  [ $SECONDS -gt 400 ] && { echo "skip c=256 $codec at ${SECONDS}s"; continue; }
  extra=(); [ $codec = bf16 ] && extra=(--engine-arg codec_dtype=bfloat16)
  timeout 120 python3 -m voxflow.bench $common --model /tmp/real-1.7b --label offline-$codec "${extra[@]}" \
    --concurrency 256 --num-prompts 512 --num-warmups 8 --max-num-seqs 256 \
    --output $R/h200_1p7b_offline_c256_$codec.json 2>&1 | grep -v "^\s*$" | tail -2
done
wait $ck
if [ $SECONDS -lt 490 ]; then
  timeout 90 python3 -m voxflow.bench $common --model /tmp/real-0.6b --label small-8gb --engine-arg codec_dtype=bfloat16 \
    --engine-arg codec_max_batch=16 --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 \
    --num-warmups 8 --max-num-seqs 64 --output $R/h200_0p6b_offline_c64.json 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
