#!/usr/bin/env bash
# Session 6, device run 4 (final numbers): the GPU sync/engine tests, 1.7B over HTTP at c=1, c=16, c=64 with the
# step trace, 0.6B offline c=64 (bf16 codec, 2 GB KV pool, codec calls of <= 16), 1.7B offline c=256.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1) &
c1=$!
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B | tail -1) &
c2=$!
timeout 100 python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/gpu/test_gpu_no_host_sync.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_dense_attention.py > $R/gpu_tests_final.txt 2>&1
tail -1 $R/gpu_tests_final.txt; grep -E "^(FAILED|ERROR)" $R/gpu_tests_final.txt
wait $c1 $c2
python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 \
  --trace-steps $R/steps_http.jsonl > $R/serve_log.txt 2>&1 &
srv=$!
for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
echo "ready at ${SECONDS}s"; grep -o "engine ready: .*" $R/serve_log.txt | head -1
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
b() { timeout 150 python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
b --base-url http://127.0.0.1:8000 --label http-full --concurrency 1 --num-prompts 3 --num-warmups 1 --output $R/h200_1p7b_http_c1.json
b --base-url http://127.0.0.1:8000 --label http-full --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16.json
b --base-url http://127.0.0.1:8000 --label http-full --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64.json
curl -s http://127.0.0.1:8000/health > $R/health.json
kill $srv; wait $srv
gzip $R/steps_http.jsonl
echo "http done at ${SECONDS}s"
b --model /tmp/real-0.6b --device cuda --label full-bf16codec --engine-arg codec_dtype=bfloat16 --engine-arg codec_max_batch=16 \
  --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
  --output $R/h200_0p6b_offline_c64.json
echo "0.6B done at ${SECONDS}s"
[ $SECONDS -lt 420 ] && b --model /tmp/real-1.7b --device cuda --label full --concurrency 256 --num-prompts 512 \
  --num-warmups 8 --max-num-seqs 256 --output $R/h200_1p7b_offline_c256.json
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
