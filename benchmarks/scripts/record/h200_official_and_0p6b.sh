#!/usr/bin/env bash
# Second H200 run: voxflow offline at the 0.6B shapes (c=64), then the OFFICIAL qwen-tts 0.1.1 at the 1.7B
# shapes (one request at a time) on the same GPU. The official package and its pinned dependencies travel as
# wheels in .whl/ (qwen-tts, transformers 4.57.3, accelerate, tokenizers 0.22, huggingface_hub 0.36, librosa and
# its small deps, soundfile); its `sox` import (only used by the unreleased 25 Hz tokenizer) is stubbed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
printf 'class Transformer:\n    pass\n' > /tmp/site/sox.py
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B
python3 -m voxflow.bench --model /tmp/real-0.6b --device cuda --dtype bfloat16 --max-new-tokens 151 --ignore-eos \
    --no-progress --no-plots --concurrency 64 --num-prompts 64 --num-warmups 2 --max-num-seqs 64 \
    --label eager-bf16 --tag batching=on --tag cuda_graphs=off --output "$OUT/h200_0p6b_offline_c64.json" 2>&1 | tail -4
python3 -c "import torch; print('peak GPU memory in this process: n/a (bench runs in its own process)')"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B
PYTHONPATH=/tmp/site:$PWD python3 tools/bench_official.py --model /tmp/real-1.7b --device cuda:0 \
    --dtype bfloat16 --num-prompts 2 --num-warmups 1 --max-new-tokens 151 --ignore-eos --no-plots \
    --output "$OUT/h200_1p7b_official_c1.json" 2>&1 | tail -8
