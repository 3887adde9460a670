#!/usr/bin/env bash
# Session 5, device run 2: all GPU tests; the fused CP layer at more rows; the step at c=1 (fused CP layer on) and
# at c=64 with the codec confined to 40 / 66 SMs; then 1.7B c=16 over HTTP (no blocking copies, 2-frame first chunks).
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests_run2.txt 2>&1
tail -3 $R/gpu_tests_run2.txt; grep -E "^_{3,} .* _{3,}$" $R/gpu_tests_run2.txt
timeout 60 python3 benchmarks/scripts/tune_cp_layer.py --rows 4,16,64 --skip-sweep > $R/tune_cp_rows4_16_64.txt 2>&1
grep -A5 "^rows" $R/tune_cp_rows4_16_64.txt
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
export PYTHONPATH=$PWD
timeout 45 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 | grep -v Warn > $R/profile_c1_fused.txt
for n in 40 66; do
  timeout 50 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager codec_sm_count=$n 2>&1 | grep -v Warn > $R/profile_c64_sm$n.txt
done
grep "per step" $R/profile_c1_fused.txt $R/profile_c64_sm*.txt
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=$PWD:/tmp/site
python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 > $R/serve_log.txt 2>&1 &
for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
timeout 90 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --base-url http://127.0.0.1:8000 --label http-full --concurrency 16 --num-prompts 64 --num-warmups 8 \
  --output $R/h200_1p7b_http_c16.json 2>&1 | grep -v "^\s*$" | tail -4
curl -s http://127.0.0.1:8000/health > $R/health_after_c16.json
kill %1; wait
cd $OUT && tar czf res.tgz r && rm -rf r
