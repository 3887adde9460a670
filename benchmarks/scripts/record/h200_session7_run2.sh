#!/usr/bin/env bash
# Prepared in session 6: 1.7B over HTTP at c=1 / c=16 / c=64 with the step trace (the default engine: arrivals'
# prompt builds spread over steps), then c=16 / c=64 again with every arrival taken at once
# (`--engine-arg add_seconds_per_step=none`, the session-6 behaviour): what the pacing buys or costs; then c=64 with
# the codec's convolutions capped at 66 programs (`codec_conv_programs=66`, half the SMs): does the talker overlap?
# (Kept as run: `codec_conv_programs` was removed after this measurement, commit a439ab4.)
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # carry: [".whl"]
export PYTHONPATH=$PWD:/tmp/site
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --base-url http://127.0.0.1:8000"
b() { timeout 150 python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
for variant in paced atonce capped; do
  extra=""; [ $variant = atonce ] && extra="--engine-arg add_seconds_per_step=none"
  [ $variant = capped ] && extra="--engine-arg codec_conv_programs=66"
  python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 $extra \
    --trace-steps $R/steps_http_$variant.jsonl > $R/serve_log_$variant.txt 2>&1 &
  srv=$!
  for _ in $(seq 150); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
  [ $variant = paced ] && b --label http-full --concurrency 1 --num-prompts 3 --num-warmups 1 --output $R/h200_1p7b_http_c1.json
  [ $variant != capped ] && b --label http-$variant --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16_$variant.json
  b --label http-$variant --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64_$variant.json
  curl -s http://127.0.0.1:8000/health > $R/health_$variant.json
  kill $srv; wait $srv; gzip $R/steps_http_$variant.jsonl
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
