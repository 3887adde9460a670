#!/usr/bin/env bash
# Session 6, device run 1: all GPU tests, then 1.7B over HTTP at c=1, c=16, c=64 with the engine step trace
# (measures the session-5 changes landed after its last GPU run), then, if time is left, one c=16 run with the
# prompt-build profiler on (diagnostic only: the profiler slows prepare).
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1) &
timeout 230 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head -20
wait
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=$PWD:/tmp/site
serve() { python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 "$@" &
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done; }
b() { timeout 150 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --base-url http://127.0.0.1:8000 --label http-full "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
serve --trace-steps $R/steps_http.jsonl > $R/serve_log.txt 2>&1
echo "ready at ${SECONDS}s"; grep -iE "captur|compil|memory" $R/serve_log.txt | head -5
b --concurrency 1 --num-prompts 3 --num-warmups 1 --output $R/h200_1p7b_http_c1.json
b --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16.json
b --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64.json
curl -s http://127.0.0.1:8000/health > $R/health.json
kill %1; wait
gzip $R/steps_http.jsonl
if [ $SECONDS -lt 470 ]; then
  serve --trace-steps $R/steps_profile.jsonl --trace-profile-prepare > $R/serve_log_profile.txt 2>&1
  b --concurrency 16 --num-prompts 32 --num-warmups 4 --output $R/diag_profiled_c16.json
  kill %1; wait; gzip $R/steps_profile.jsonl
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
