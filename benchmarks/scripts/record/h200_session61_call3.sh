#!/usr/bin/env bash
# Session 61 call 3 (an H100, warm; 201 s; prepared in session 58 as h200_next_run1.sh). carry [".whl", ".device_tree"]
# (the tree plus .whl must stay under the device's 64 MiB copy limit).
# 1. The 1.7B targets over HTTP under today's defaults (the 8-chunk layout, the upsample stages over rows, the API
#    process's startup objects frozen out of its garbage collector, and since session 59 the code predictor's GEMMs
#    on skinny_linear + PDL, untried on the 1.7B): c=16 twice (session 58's one run had p99 107 ms
#    against the 100 ms target: twelve requests held by a ~60 ms stall of the API process, one event-loop wake-up
#    late by 50-100 ms; each stop_server prints the API's GC pauses since the server was ready), then c=1 and c=64.
# 2. On the same server with --no-gc-freeze, c=16 twice more, if time is left (UNTIL, default 400 s).
# Then h200_next_ab3.sh (the 0.6B target in its d runs) on the warm machine, if the session's budget allows.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
if serve_variant frozen; then
  bench_http_at 16 c16_frozen_1
  bench_http_at 16 c16_frozen_2
  pack_results
  bench_http_at 1 c1_frozen
  bench_http_at 64 c64_frozen
  stop_server frozen
fi
pack_results
if (( SECONDS < ${UNTIL:-400} )) && serve_variant unfrozen --no-gc-freeze; then
  bench_http_at 16 c16_unfrozen_1
  bench_http_at 16 c16_unfrozen_2
  stop_server unfrozen
fi
grep -h "^| c=" $R/h200_1p7b_http_*.md
grep -H "ran dry" $R/*.md
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
