#!/usr/bin/env bash
# Session 5, device run 3: the sync test after the eager-prefill fix; the fused CP layer at 4/16/64 rows; prepare's
# host time on the real 1.7B; 1.7B c=16 over HTTP with the engine's per-step trace.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_no_host_sync.py > $R/gpu_sync_test.txt 2>&1; tail -2 $R/gpu_sync_test.txt
timeout 60 python3 benchmarks/scripts/tune_cp_layer.py --rows 4,16,64 --skip-sweep > $R/tune_cp_rows4_16_64.txt 2>&1
grep -A5 "^rows" $R/tune_cp_rows4_16_64.txt
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
timeout 60 python3 benchmarks/scripts/profile_prepare.py /tmp/real-1.7b > $R/profile_prepare.txt 2>&1; head -3 $R/profile_prepare.txt
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=$PWD:/tmp/site
python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 \
  --trace-steps $R/steps_c16.jsonl > $R/serve_log.txt 2>&1 &
for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
timeout 90 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --base-url http://127.0.0.1:8000 --label http-full --concurrency 16 --num-prompts 64 --num-warmups 8 \
  --output $R/h200_1p7b_http_c16.json 2>&1 | grep -v "^\s*$" | tail -4
kill %1; wait
cd $OUT && tar czf res.tgz r && rm -rf r
