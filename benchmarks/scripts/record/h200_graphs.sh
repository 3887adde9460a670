#!/usr/bin/env bash
# Third H200 run: GPU engine + codec tests (engine eager / CUDA graphs / graphs + Triton kernels == CPU fp32
# reference codes; codec graphs vs eager, bf16 SNR), then the stacked comparison at the real 1.7B shapes
# (random weights, bf16 talker, fp32 codec, 150 frames per request, offline): CUDA graphs without and with
# the Triton kernels. (Eager numbers: benchmarks/results/h200/2026-11-29-eager-1.7b.)
# Usage (repo root, on the GPU machine): OUT=results_dir bash benchmarks/scripts/record/h200_graphs.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
common="--model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
b() { python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
b --label graphs+kernels --tag stack=graphs+kernels --concurrency 1 --num-prompts 3 --num-warmups 1 \
  --output "$OUT/h200_1p7b_offline_graphs+kernels_c1.json"
b --label graphs+kernels --tag stack=graphs+kernels --concurrency 16,64 --num-prompts 64 --num-warmups 8 \
  --max-num-seqs 64 --output "$OUT/h200_1p7b_offline_graphs+kernels_c16_c64.json"
b --label graphs --tag stack=graphs --engine-arg kernels=false --concurrency 1 --num-prompts 3 --num-warmups 1 \
  --output "$OUT/h200_1p7b_offline_graphs_c1.json"
b --label graphs --tag stack=graphs --engine-arg kernels=false --concurrency 64 --num-prompts 64 --num-warmups 8 \
  --max-num-seqs 64 --output "$OUT/h200_1p7b_offline_graphs_c64.json"
