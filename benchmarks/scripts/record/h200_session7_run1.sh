#!/usr/bin/env bash
# Prepared in session 6 for the next device call: what landed after session 6's last GPU run, measured first.
#  1. the slot-buffer growth GPU test (prefill graphs kept, decode graphs recaptured into a new pool) and the codec
#     GPU tests (the fused overlap-add of the channels-last transposed convolution)
#  2. the codec alone: a 64 x 25-frame call and per-shape convolution tiles (tune_causal_conv.py)
#  3. STAGE=clone: the Base model (voice clone, ICL) offline at c=1 / c=16 — crashed twice in session 6
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site (carry: [".whl"])
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b-base --variant base --size 1.7B | tail -1) &
ck=$!
timeout 150 python3 -m pytest -q -rs -n 2 -p no:cacheprovider tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py \
  > $R/gpu_tests.txt 2>&1
tail -1 $R/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt
timeout 200 python3 benchmarks/scripts/tune_causal_conv.py 64 25 > $R/tune_causal_conv.txt 2>&1
grep -E "^codec|Error" $R/tune_causal_conv.txt
wait $ck
timeout 200 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
  --num-prompts 16 --num-warmups 2 --max-num-seqs 64 --output $R/h200_1p7b_clone_offline.json 2>&1 \
  | grep -v "^\s*$" | tail -6
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
