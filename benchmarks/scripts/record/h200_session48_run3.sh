#!/usr/bin/env bash
# Session 48 call 3; carry [".whl", ".device_tree"]. ~480 s.
# Call 2: a decode out of KV pages waiting for a request that has made its last frame fired once a run; the 3-8
# preemptions of a <= 8 GB 0.6B c=64 run come 2-17 steps before a wave's first end. `kv_wait_frames` (16, new): it
# also waits for a request that holds every page it needs and ends within 16 frames. A/B: on (default) / off (0),
# offline alternating, then over HTTP. The first run compiles the kernels on a fresh machine (call 2's timed out at
# 150 s), so it runs under a longer limit.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
pack_results
timeout 330 python3 -m voxflow.bench $UNIQUE --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress \
  --no-plots --device cuda --model /tmp/real-0.6b --label small-on_0 --engine-arg codec_max_batch=16 \
  --engine-arg kv_cache_bytes=2400000000 --concurrency 64 --num-prompts $SMALL_PROMPTS --num-warmups 8 \
  --max-num-seqs 64 --engine-arg trace_steps=$R/steps_0p6b_on_0.jsonl \
  --output "$R/h200_0p6b_offline_c64_on_0.json.gz" 2>&1 | grep -v "^\s*$" | tail -1
echo "  at ${SECONDS}s"
bench_small_traced off_1 --engine-arg kv_wait_frames=0
bench_small_traced on_1
bench_small_traced off_2 --engine-arg kv_wait_frames=0
pack_results
http_small on_1
http_small off_1 --engine-arg kv_wait_frames=0
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
for f in $R/*.md; do echo "$f: $(grep -h '^| c=' $f | cut -d'|' -f4,7)"; grep -h "preemptions\|waited a step" $f; done
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
pack_results
echo "done at ${SECONDS}s"
