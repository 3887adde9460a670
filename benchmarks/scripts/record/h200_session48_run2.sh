#!/usr/bin/env bash
# Session 48 call 2; carry [".whl", ".device_tree"]. ~450 s.
# The <= 8 GB 0.6B configuration runs out of KV pages at a closed-loop wave's end (call 1: 4-8 preemptions a run,
# each re-prefilling its prompt and ~150 frames; one such re-prefill's host phase took 7.3 ms while the GPU idled).
# `kv_wait_for_finishing` (new, on by default): a decode that finds no page while a request has made its last frame
# waits a step for that request's pages instead. A/B, offline then over HTTP, alternating: on (default) / off.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
pack_results
bench_small_traced off_1 --engine-arg kv_wait_for_finishing=false      # (compiles the kernels; timed out at 150 s)
bench_small_traced on_1
bench_small_traced on_2
bench_small_traced off_2 --engine-arg kv_wait_for_finishing=false
pack_results
http_small on_1
http_small off_1 --engine-arg kv_wait_for_finishing=false
http_small off_2 --engine-arg kv_wait_for_finishing=false
http_small on_2
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
for f in $R/*.md; do echo "$f: $(grep -h '^| c=' $f | cut -d'|' -f4,7)"; grep -h "preemptions\|waited a step" $f; done
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
pack_results
echo "done at ${SECONDS}s"
