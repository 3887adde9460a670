#!/usr/bin/env bash
# Session 50, call 2 (right after call 1: a warm machine, kernels compiled); carry [".whl", ".device_tree"]. ~480 s.
# The 0.6B c=64 target's own terms (over HTTP, <= 8 GB): the default server, fp8 KV pages in a 1.4 GB pool
# (kv_cache_dtype=fp8), and emit_while_waiting (session 49, never run on a GPU: chunks and finals that land while the
# host waits for the decode in flight leave at once), alternating, two rounds. Every server traces its requests, so
# each run's turnover splits hop by hop (http_turn.py, session 49's h200_next_run1.sh: first served use).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
for round in 1 2; do
  http_small off_$round
  http_small fp8_$round --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000
  http_small emit_$round --engine-arg emit_while_waiting=true
  pack_results
done
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
