#!/usr/bin/env bash
# Session 47, call 5; carry [".whl", ".device_tree"]. ~250 s.
# 1. The serving path without a model on this host (benchmarks/scripts/api_path_load.py: `voxflow serve`'s app and
#    engine process, a core that sleeps 6.3 ms a step, `voxflow bench` at c=64): the API process's CPU a request and
#    the turnover (final record -> the replacement's add) with h11 + asyncio and with httptools + uvloop.
# 2. 0.6B c=64 offline and over HTTP on one machine, traced: the turnover summary (step_trace_summary) of each.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
for v in "h11 asyncio" "httptools uvloop"; do
  set -- $v
  echo "== paced $1 $2"
  timeout 90 python3 benchmarks/scripts/api_path_load.py --per-user 6 --http $1 --loop $2 2>&1 \
    | grep -v slowest | tee -a $R/api_path_load.txt | tail -4
done
pack_results
wait $CK6
bench_small_traced offline
http_small http
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
pack_results
echo "done at ${SECONDS}s"
