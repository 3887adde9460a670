#!/usr/bin/env bash
# Session 8, call 5 (carry [".whl"], ~4 min, the session's last device minutes): the packed prefill
# (engine/packed_prefill.py, --engine-arg packed_prefill=true): its GPU test (codes == the CPU reference through the
# packed graphs and the decode kernel's write-first branch), then HTTP c=16 / c=64 with the step trace against call 4's
# default engine (c=16 103 / 116 ms, c=64 454.8 audio-s/s). Results straight under $OUT (no tar: a timeout keeps them).
set -uo pipefail
R=$OUT; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 80 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_packed_prefill_equals_cpu_reference" > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -6
wait $ck
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --base-url http://127.0.0.1:8000"
python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 \
  --engine-arg packed_prefill=true --trace-steps $R/steps_http_packed.jsonl > $R/serve_log_packed.txt 2>&1 &
srv=$!
up=0
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:8000/ready > /dev/null && { up=1; break; }
  kill -0 $srv 2>/dev/null || break
  sleep 1
done
if [ $up = 1 ]; then
  timeout 40 python3 -m voxflow.bench $common --label http-packed --concurrency 16 --num-prompts 64 --num-warmups 8 \
    --output $R/h200_1p7b_http_c16_packed.json 2>&1 | grep -v "^\s*$" | tail -2
  timeout 45 python3 -m voxflow.bench $common --label http-packed --concurrency 64 --num-prompts 192 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_packed.json 2>&1 | grep -v "^\s*$" | tail -2
  curl -s http://127.0.0.1:8000/health > $R/health_packed.json
else
  echo "server did not come up"; grep -v "^\s*$" $R/serve_log_packed.txt | tail -5
fi
kill $srv 2>/dev/null; wait $srv; gzip -f $R/steps_http_packed.jsonl 2>/dev/null
echo "done at ${SECONDS}s"
