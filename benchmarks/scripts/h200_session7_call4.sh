#!/usr/bin/env bash
# Session 7, fourth call: the trailing text in shared pages measured. (1) GPU tests: the growth test (now 600 text
# rows over 2 slots' pages) and the no-hidden-sync test (its Base stored voice writes text pages at attach);
# (2) the voice-clone benchmark with the step trace: no graph captures expected while serving; (3) if time is
# left, profile_step.py at 64 and 256 streams (where the best-concurrency step goes).
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # carry: [".whl"]
export PYTHONPATH=$PWD:/tmp/site
mk() { python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-$1 --variant $2 --size 1.7B | tail -1; }
(mk 1.7b-base base; mk 1.7b custom_voice) &
ck=$!
timeout 170 python3 -m pytest -v -rfs --tb=short -n 2 -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_prefill_graphs_survive_slot_buffer_growth" \
  tests/gpu/test_gpu_no_host_sync.py > $R/gpu_tests_pages.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests_pages.txt | tail -8
wait $ck
timeout 120 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
  --num-prompts 16 --num-warmups 2 --max-num-seqs 64 --engine-arg trace_steps=$R/steps_clone.jsonl \
  --output $R/h200_1p7b_clone_offline.json 2>&1 | grep -v "^\s*$" | tail -5
python3 -c "
import json
rows = [json.loads(l) for l in open('$R/steps_clone.jsonl')]
print('steps', len(rows), 'with captures', [(r['step'], r['decode'], r['capture_ms']) for r in rows if r['capture_ms']])
"
gzip $R/steps_clone.jsonl
echo "clone done at ${SECONDS}s"
if [ $SECONDS -lt 300 ]; then
  timeout $((480 - SECONDS)) python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 2>&1 | grep -v Warning \
    > $R/profile_step_64_256.txt
  grep -E "per step|kernels per step" $R/profile_step_64_256.txt
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
