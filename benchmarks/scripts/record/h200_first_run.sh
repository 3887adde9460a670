#!/usr/bin/env bash
# First H200 run (device machine): GPU correctness tests, then the engine offline (no HTTP) at the real 1.7B
# shapes with random weights, eager PyTorch (no CUDA graphs / fused kernels yet), fixed 150 frames per request.
# Usage (repo root, on the GPU machine): OUT=results_dir bash benchmarks/scripts/record/h200_first_run.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B
common="--model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
python3 -m voxflow.bench $common --concurrency 1 --num-prompts 3 --num-warmups 1 --label eager-bf16 \
    --tag batching=on --tag cuda_graphs=off --output "$OUT/h200_1p7b_offline_c1.json" 2>&1 | tail -6
python3 -m voxflow.bench $common --concurrency 16 --num-prompts 16 --num-warmups 2 --max-num-seqs 64 \
    --label eager-bf16 --tag batching=on --tag cuda_graphs=off --output "$OUT/h200_1p7b_offline_c16.json" 2>&1 | tail -6
python3 -m voxflow.bench $common --concurrency 64 --num-prompts 64 --num-warmups 2 --max-num-seqs 64 \
    --label eager-bf16 --tag batching=on --tag cuda_graphs=off --output "$OUT/h200_1p7b_offline_c64.json" 2>&1 | tail -6
