#!/usr/bin/env bash
# Session 18, call 4 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive back):
# the paged decode's tensor-core variant with call 3's fastest launch as its default (32-token tiles, 4 warps, one
# split at 64 rows):
#  1. GPU tests of the paged decode;
#  2. profile_step c=64: the default vs VOXFLOW_PAGED_DECODE_TC=0 (the CUDA-core variant), one machine;
#  3. HTTP c=64: the default, then the CUDA-core variant (A/B on one machine);
#  4. offline 0.6B c=64 in the <= 8 GB configuration.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
trap 'tar czf $OUT/r.tgz -C /tmp r' EXIT TERM
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
gpu_tests 60 tests/gpu/test_gpu_paged_attention.py
wait $CK
timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_default.txt
VOXFLOW_PAGED_DECODE_TC=0 timeout 50 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_cuda_cores.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_cuda_cores.txt
echo "profiles done at ${SECONDS}s"
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "http default done at ${SECONDS}s"
if [ $SECONDS -lt 300 ]; then
  export VOXFLOW_PAGED_DECODE_TC=0
  if serve_variant cuda_cores; then
    bench_http --label http-cuda-cores --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_cuda_cores.json.gz
  fi
  stop_server cuda_cores
  unset VOXFLOW_PAGED_DECODE_TC
fi
wait $CK6
if [ $SECONDS -lt 390 ]; then
  timeout 90 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-0.6b --label small-8gb --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
    --output $R/h200_0p6b_offline_c64_8gb.json.gz 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
