#!/usr/bin/env bash
# Fifth H200 run (batched prefill): GPU engine test, then the full stack (CUDA graphs + Triton kernels, batched
# prefill) at 1.7B c=1 / c=16 / c=64, 0.6B c=64 with a 2 GB KV cache, and 1.7B c=128 with the bf16 codec.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.txt"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
common="--device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
b() { python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
b --model /tmp/real-1.7b --label full --tag stack=graphs-kernels-batchprefill --concurrency 1 --num-prompts 3 \
  --num-warmups 1 --output "$OUT/h200_1p7b_offline_full_c1.json"
b --model /tmp/real-1.7b --label full --tag stack=graphs-kernels-batchprefill --concurrency 16,64 --num-prompts 64 \
  --num-warmups 8 --max-num-seqs 64 --output "$OUT/h200_1p7b_offline_full_c16_c64.json"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B | tail -1
b --model /tmp/real-0.6b --label full --tag stack=graphs-kernels-batchprefill --concurrency 64 --num-prompts 64 \
  --num-warmups 8 --max-num-seqs 64 --engine-arg kv_cache_bytes=2000000000 \
  --output "$OUT/h200_0p6b_offline_full_c64.json"
b --model /tmp/real-1.7b --label full-bf16codec --tag stack=graphs-kernels-batchprefill-bf16codec \
  --engine-arg codec_dtype=bfloat16 --concurrency 128 --num-prompts 128 --num-warmups 8 --max-num-seqs 128 \
  --output "$OUT/h200_1p7b_offline_full_bf16codec_c128.json"
