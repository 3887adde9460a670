#!/usr/bin/env bash
# Session 7, second call: (1) the engine + codec GPU tests again, verbose (the first call's run hit its timeout
# with one unnamed failure); (2) the voice-clone benchmark again after priming the reference frames in one batch,
# with the step trace.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site (carry: [".whl"])
export PYTHONPATH=$PWD:/tmp/site
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b-base --variant base --size 1.7B | tail -1) &
ck=$!
timeout 300 python3 -m pytest -v -rfs --tb=short -n 2 -p no:cacheprovider tests/gpu/test_gpu_engine.py \
  tests/gpu/test_gpu_codec.py > $R/gpu_tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" $R/gpu_tests.txt | grep -v "^tests.*PASSED" | tail -12
wait $ck
timeout 150 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
  --num-prompts 16 --num-warmups 2 --max-num-seqs 64 --engine-arg trace_steps=$R/steps_clone.jsonl \
  --output $R/h200_1p7b_clone_offline.json 2>&1 | grep -v "^\s*$" | tail -6
gzip $R/steps_clone.jsonl
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
