#!/usr/bin/env bash
# Session 10, call 2 (carry [".whl"]): decode steps split into two half-batches on two CUDA streams
# (EngineConfig.decode_split_batch, engine/graph_runner.py at 64fc57a; reverted after this call: slower); and the first
# chunk of 5 frames above 16 streams (the new default after call 1).
#  1. GPU test: the split step (two graph branches) == the CPU reference;
#  2. HTTP c=64 (256 prompts): default vs decode_split_batch=32 (bucket 64 -> 2 x 32);
#  3. profile_step.py c=64: default vs split (step time, kernels by stream);
#  4. offline c=256 with decode_split_batch=128 (session 9: 717.9-721.9 audio-s/s without).
# Decide: split on by default from the bucket where it wins, if c=64 throughput rises and TTFP p99 is not worse.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 150 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_split_decode_steps_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -6
wait $ck
for variant in default split32; do
  args=(); [ $variant = split32 ] && args=(--engine-arg decode_split_batch=32)
  if serve_variant $variant "${args[@]}"; then
    bench_http --label http-$variant --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_$variant.json
  fi
  stop_server $variant
done
for variant in default split32; do
  args=(); [ $variant = split32 ] && args=(decode_split_batch=32)
  [ $SECONDS -gt 430 ] && { echo "skip profile $variant at ${SECONDS}s"; continue; }
  timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager "${args[@]}" 2>&1 \
    | grep -v Warn > $R/profile_step_64_$variant.txt
  grep -E "per step|by stream" $R/profile_step_64_$variant.txt
done
if [ $SECONDS -lt 450 ]; then
  timeout 100 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-1.7b --label offline-split128 --engine-arg decode_split_batch=128 \
    --concurrency 256 --num-prompts 512 --num-warmups 8 --max-num-seqs 256 \
    --output $R/h200_1p7b_offline_c256_split128.json 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
