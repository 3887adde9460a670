#!/usr/bin/env bash
# Prepared in session 50 for the call after h200_next_run1.sh (a warm machine, or a fresh one whose first server
# compiles, up to 300 s); carry [".whl", ".device_tree"]; rename when run. ~500 s, packed after each run.
# The 0.6B c=64 target's own terms (over HTTP, <= 8 GB): the default server (bf16 pages, 2.4 GB pool) against fp8
# pages in a 1.4 GB pool (kv_cache_dtype=fp8), alternating, two rounds; then emit_while_waiting (session 49, never
# served: chunks and finals that land while the host waits for the decode in flight leave at once). Every server
# traces its requests, so each run's turnover splits hop by hop (http_turn.py; its first served use).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
for round in 1 2; do
  http_small off_$round
  pack_results
  http_small fp8_$round --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000
  pack_results
done
http_small emit_1 --engine-arg emit_while_waiting=true
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
