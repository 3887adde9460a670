#!/usr/bin/env bash
# Session 48 call 4; carry [".whl", ".device_tree"]. ~330 s.
# Every preempted request's re-prefill read the slot's frame count back from the GPU (resume_embeds), so the host
# waited for the decode in flight: in calls 1-3's offline traces those steps' host prefill phase took 5.7-6.2 ms and
# their walls 15-26 ms. The engine now passes its own count. A/B on one machine: new (A) / old (B: the engine's call
# edited back to `resume_embeds(seq.slot)` in this copy of the tree), offline 0.6B c=64 <= 8 GB, traced.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
pack_results
old() { sed -i 's/self.model.resume_embeds(seq.slot, seq.num_frames)/self.model.resume_embeds(seq.slot)/' voxflow/engine/engine.py; }
new() { sed -i 's/self.model.resume_embeds(seq.slot)$/self.model.resume_embeds(seq.slot, seq.num_frames)/' voxflow/engine/engine.py; }
timeout 330 python3 -m voxflow.bench $UNIQUE --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress \
  --no-plots --device cuda --model /tmp/real-0.6b --label small-new_0 --engine-arg codec_max_batch=16 \
  --engine-arg kv_cache_bytes=2400000000 --concurrency 64 --num-prompts $SMALL_PROMPTS --num-warmups 8 \
  --max-num-seqs 64 --engine-arg trace_steps=$R/steps_0p6b_new_0.jsonl \
  --output "$R/h200_0p6b_offline_c64_new_0.json.gz" 2>&1 | grep -v "^\s*$" | tail -1
echo "  at ${SECONDS}s"
old; grep -c "resume_embeds(seq.slot)$" voxflow/engine/engine.py
bench_small_traced old_1
new; grep -c "resume_embeds(seq.slot, seq.num_frames)" voxflow/engine/engine.py
bench_small_traced new_1
old; bench_small_traced old_2
new
pack_results
python3 benchmarks/scripts/resume_steps.py $R/steps_0p6b_*.jsonl > $R/resume_steps.txt; cat $R/resume_steps.txt
for f in $R/*.md; do echo "$f: $(grep -h '^| c=' $f | cut -d'|' -f4,7)"; grep -h "preemptions" $f; done
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
pack_results
echo "done at ${SECONDS}s"
