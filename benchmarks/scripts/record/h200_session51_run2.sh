#!/usr/bin/env bash
# Session 51 call 2; carry [".whl", ".device_tree"]. ~480 s, packed after each run.
# server compiles, up to 300 s); carry [".whl", ".device_tree"]; rename when run. ~480 s, packed after each run.
# The 0.6B c=64 target's own terms (over HTTP, <= 8 GB). Over HTTP a replaced row waits 34-47 ms between its
# request's final record and its replacement's add, against 17-21 offline (session 49's step traces): the HTTP
# turn, never split on the GPU host. Every server here traces its requests, so each run's turn splits hop by hop
# (http_turn.py's first served use). Alternating: the defaults against emit_while_waiting (session 49, never
# served: chunks and finals that land while the host waits for the decode in flight leave at once, not at the
# step's end), two rounds; then fp8 pages in a 1.4 GB pool if the time is there.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
export VOXFLOW_PAGED_DECODE_STAGES=2      # session 51 call 1: -13% attention, 0.6B c=64 offline +6%
start_call 0.6B
wait $CK6
for round in 1 2; do
  http_small off_$round
  pack_results
  http_small emit_$round --engine-arg emit_while_waiting=true
  pack_results
done
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
(( SECONDS < 470 )) && http_small fp8_1 --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000
pack_results
echo "done at ${SECONDS}s"
