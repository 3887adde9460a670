#!/usr/bin/env bash
# Session 5, device run 4: the engine GPU tests, then 1.7B over HTTP at c=1, c=16, c=64 with the engine step trace.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
git log -1 --format=%H > $R/commit.txt 2>/dev/null
timeout 100 python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py tests/gpu/test_gpu_snake_beta.py > $R/gpu_tests_run4.txt 2>&1
tail -2 $R/gpu_tests_run4.txt; grep -E "^_{3,} .* _{3,}$" $R/gpu_tests_run4.txt
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=$PWD:/tmp/site
python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 \
  --trace-steps $R/steps_http.jsonl > $R/serve_log.txt 2>&1 &
for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
b() { timeout 150 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --base-url http://127.0.0.1:8000 --label http-full "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
b --concurrency 1 --num-prompts 3 --num-warmups 1 --output $R/h200_1p7b_http_c1.json
b --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16.json
b --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64.json
curl -s http://127.0.0.1:8000/health > $R/health.json
kill %1; wait
gzip $R/steps_http.jsonl
cd $OUT && tar czf res.tgz r && rm -rf r
