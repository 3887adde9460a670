#!/usr/bin/env bash
# Session 6, device run 6: the prefill-graph fix (GPU test), then the Base model (voice clone, ICL with a 3 s
# reference) offline at c=1 and c=16 — the workload that found the bug in run 5.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
[ -d /tmp/real-1.7b-base ] || (python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b-base --variant base --size 1.7B | tail -1) &
ck=$!
timeout 100 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_engine.py -k "survive or single" > $R/gpu_test_prefill_fix.txt 2>&1
tail -1 $R/gpu_test_prefill_fix.txt; grep -E "^(FAILED|ERROR)" $R/gpu_test_prefill_fix.txt
wait $ck
timeout 170 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
  --num-prompts 16 --num-warmups 2 --max-num-seqs 64 --output $R/h200_1p7b_clone_offline.json 2>&1 | grep -v "^\s*$" | tail -6
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
