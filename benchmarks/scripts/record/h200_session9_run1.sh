#!/usr/bin/env bash
# Prepared in session 8 (its device time ran out) for the next session's first call, carry [".whl"]:
#  1. GPU tests of the tiled packed-prefill attention (kernels/paged_prefill_attention.py: real shapes, CUDA graph
#     replay with other chunks) and the packed engine == the CPU reference through it; the kernel's launch settings
#     against the decode kernel per row (tune_paged_prefill.py: set the defaults from it);
#  2. HTTP A/B, default (padded prefill graphs) against --engine-arg packed_prefill=true, c=16 with 128 prompts
#     (8 waves: call 5 of session 8 had 4 and the waves differed by more than the change) and c=64, with step traces.
#     Decide: packed on by default if c=16 p99 and c=64 audio-s/s are not worse.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 200 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_paged_prefill.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_packed_prefill_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -8
timeout 120 python3 benchmarks/scripts/tune_paged_prefill.py > $R/tune_paged_prefill.txt 2>&1
grep -v Warn $R/tune_paged_prefill.txt | tail -4
wait $ck
for variant in default packed; do
  extra=(); [ $variant = packed ] && extra=(--engine-arg packed_prefill=true)
  if serve_variant $variant "${extra[@]}"; then
    bench_http --label http-$variant --concurrency 16 --num-prompts 128 --num-warmups 8 \
      --output $R/h200_1p7b_http_c16_$variant.json
    bench_http --label http-$variant --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_$variant.json
  fi
  stop_server $variant
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
