#!/usr/bin/env bash
# Fourth H200 run (after making the flag copy asynchronous): a profile of the steady-state step at c=64, the
# full stack (CUDA graphs + Triton kernels) at 1.7B c=1 / c=16 / c=64, and 0.6B at c=64 with a 2 GB KV cache.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 2>&1 | grep -v Warning | tail -32 | tee "$OUT/profile_1p7b_c64.txt"
common="--device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
b() { python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
b --model /tmp/real-1.7b --label graphs-kernels --tag stack=graphs-kernels --concurrency 1 --num-prompts 3 \
  --num-warmups 1 --output "$OUT/h200_1p7b_offline_graphs-kernels_c1.json"
b --model /tmp/real-1.7b --label graphs-kernels --tag stack=graphs-kernels --concurrency 16,64 --num-prompts 64 \
  --num-warmups 8 --max-num-seqs 64 --output "$OUT/h200_1p7b_offline_graphs-kernels_c16_c64.json"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B | tail -1
b --model /tmp/real-0.6b --label graphs-kernels --tag stack=graphs-kernels --concurrency 64 --num-prompts 64 \
  --num-warmups 8 --max-num-seqs 64 --engine-arg kv_cache_bytes=2000000000 \
  --output "$OUT/h200_0p6b_offline_graphs-kernels_c64.json"
