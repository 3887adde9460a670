#!/usr/bin/env bash
# Session 8, call 4 (carry [".whl"]): prompt builds from projected text rows kept per id (text_rows.py) measured:
# GPU tests (the rows within one bf16 rounding, the fp32 engine still == the CPU reference), HTTP c=16 / c=64 with
# the step trace (prepare_ms a request: 0.9-1.0 ms at c=64 and 2.4-2.8 at c=16 in call 1) and c=16 with the
# builds profiled; then where a c=64 step goes now (kernels per step, top kernels), for the next kernel work.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 150 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_text_rows.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference" > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -8
wait $ck
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --base-url http://127.0.0.1:8000"
b() { timeout 150 python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -2; }
for variant in default profprep; do
  extra=""; [ $variant = profprep ] && extra="--trace-profile-prepare"
  python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 $extra \
    --trace-steps $R/steps_http_$variant.jsonl > $R/serve_log_$variant.txt 2>&1 &
  srv=$!
  up=0
  for _ in $(seq 150); do
    curl -sf http://127.0.0.1:8000/ready > /dev/null && { up=1; break; }
    kill -0 $srv 2>/dev/null || break
    sleep 1
  done
  if [ $up = 1 ]; then
    b --label http-$variant --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16_$variant.json
    [ $variant = default ] && \
      b --label http-$variant --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64_$variant.json
    curl -s http://127.0.0.1:8000/health > $R/health_$variant.json
  else
    echo "== $variant: server did not come up"; tail -5 $R/serve_log_$variant.txt
  fi
  kill $srv 2>/dev/null; wait $srv; gzip -f $R/steps_http_$variant.jsonl 2>/dev/null
done
[ $SECONDS -lt 330 ] && timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warning > $R/profile_step_64.txt
grep -E "per step" $R/profile_step_64.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
