#!/usr/bin/env bash
# Third H200 run: GPU tests (engine eager / CUDA graphs / graphs + Triton kernels == CPU fp32 reference; kernels
# and codec graphs vs their references), then the stacked comparison at the real 1.7B shapes (random weights,
# bf16 talker, fp32 codec, 150 frames per request): eager, CUDA graphs, CUDA graphs + kernels, offline, and the
# full stack over HTTP (voxflow serve, streamed pcm on loopback).
# Usage (repo root, on the GPU machine): OUT=results_dir bash benchmarks/scripts/h200_graphs.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/env.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
python3 -m voxflow.tools.codec_snr --model /tmp/real-1.7b --dtype bfloat16 --device cuda --frames 150 2>&1 | tail -3 | tee "$OUT/codec_snr_bf16.txt"
common="--model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
run() {  # label, engine args..., then: -- concurrency prompts
  local label=$1; shift
  python3 -m voxflow.bench $common --label "$label" "$@" 2>&1 | tail -3
}
for stack in "eager:--engine-arg cuda_graphs=false --engine-arg kernels=false" \
             "graphs:--engine-arg kernels=false" "graphs+kernels:"; do
  label=${stack%%:*}; args=${stack#*:}
  run "$label" $args --concurrency 1 --num-prompts 3 --num-warmups 1 --tag stack="$label" \
      --output "$OUT/h200_1p7b_offline_${label}_c1.json"
  run "$label" $args --concurrency 64 --num-prompts 64 --num-warmups 4 --max-num-seqs 64 --tag stack="$label" \
      --output "$OUT/h200_1p7b_offline_${label}_c64.json"
done
