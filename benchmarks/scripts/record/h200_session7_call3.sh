#!/usr/bin/env bash
# Session 7, third call: the two GPU tests fixed after the second call, the voice-clone benchmark with graph
# captures in the step trace (capture_ms: is the first decode of a new batch size a capture?), then
# h200_session7_run2.sh (HTTP c=1/16/64 paced, at once, capped codec grid), which packs everything into res.tgz.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # carry: [".whl"]
export PYTHONPATH=$PWD:/tmp/site
mk() { python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-$1 --variant $2 --size 1.7B | tail -1; }
(mk 1.7b-base base; mk 1.7b custom_voice) &
ck=$!
timeout 200 python3 -m pytest -v -rfs --tb=short -n 2 -p no:cacheprovider \
  "tests/gpu/test_gpu_engine.py::test_gpu_prefill_graphs_survive_slot_buffer_growth" \
  "tests/gpu/test_gpu_codec.py::test_bf16_channels_last_stack_is_close_to_the_bf16_ncl_kernels" \
  > $R/gpu_tests_fixed.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests_fixed.txt | tail -8
wait $ck
timeout 150 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
  --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
  --num-prompts 16 --num-warmups 2 --max-num-seqs 64 --engine-arg trace_steps=$R/steps_clone.jsonl \
  --output $R/h200_1p7b_clone_offline.json 2>&1 | grep -v "^\s*$" | tail -5
python3 -c "
import json
for l in open('$R/steps_clone.jsonl'):
    r = json.loads(l)
    if r['capture_ms'] or r['ms']['launch_decode'] > 50: print(r['step'], r['decode'], r['capture_ms'], r['ms'])
" | head -12
gzip $R/steps_clone.jsonl
echo "clone done at ${SECONDS}s"
bash benchmarks/scripts/record/h200_session7_run2.sh
