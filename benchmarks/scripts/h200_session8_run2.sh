#!/usr/bin/env bash
# Session 8, call 2 (carry [".whl"]): the codec confined to part of the SMs (engine/sm_partition.py, a CUDA green
# context). First its GPU test (graphs, async decodes and events across the two contexts == the whole-GPU codec),
# then HTTP c=16 / c=64 with --engine-arg codec_sms=N against the default engine in the same call: do the talker
# steps behind a codec launch keep their ~7 ms (step trace), and what does it do to audio-s/s and TTFP?
# Call 2 (default split flags): the servers' codec capture failed in its first TF32 GEMM; call 3 adds the split
# that keeps thread-block clusters possible, the probe of split flags, and VARIANTS="sms100 sms66 sms116".
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 150 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_codec.py::test_codec_on_a_partition_of_the_sms_equals_the_whole_gpu" > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -8
timeout 150 python3 benchmarks/scripts/probe_sm_partition.py 66,100 > $R/probe_sm_partition.txt 2>&1
cat $R/probe_sm_partition.txt
wait $ck
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --base-url http://127.0.0.1:8000"
b() { timeout 150 python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -2; }
for variant in ${VARIANTS:-sms100 default sms66 sms100prio sms116}; do
  [ $SECONDS -gt 480 ] && { echo "skipped $variant (time)"; continue; }
  case $variant in
    default) extra="" ;;
    sms66) extra="--engine-arg codec_sms=66" ;;
    sms100) extra="--engine-arg codec_sms=100" ;;
    sms116) extra="--engine-arg codec_sms=116" ;;
    sms100prio) extra="--engine-arg codec_sms=100 --engine-arg talker_high_priority=true" ;;
  esac
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
    echo "== $variant"
    b --label http-$variant --concurrency 16 --num-prompts 64 --num-warmups 8 --output $R/h200_1p7b_http_c16_$variant.json
    b --label http-$variant --concurrency 64 --num-prompts 192 --num-warmups 8 --output $R/h200_1p7b_http_c64_$variant.json
    curl -s http://127.0.0.1:8000/health > $R/health_$variant.json
  else
    echo "== $variant: server did not come up"; tail -5 $R/serve_log_$variant.txt
  fi
  kill $srv 2>/dev/null; wait $srv; gzip -f $R/steps_http_$variant.jsonl 2>/dev/null
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
