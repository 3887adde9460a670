#!/usr/bin/env bash
# Prepared in session 52; run in session 53 as call 1 (a fresh machine is fine: the first server compiles the kernels);
# carry [".whl", ".device_tree"]; rename when run. ~450 s.
# The HTTP turn's two hops through the API process (6-11 ms each at 0.6B c=64 on session 51-52's H100s, ~1.5 ms at
# c=8 on a model-less server) against uvicorn's httptools parser + uvloop, alternating: session 47 found them neutral
# in throughput (731.8 / 730.1 against 730.6 / 730.6) before the turn could be split hop by hop; on the model-less
# server they cut the API's CPU a request 4.39 -> 3.14 ms. Each server's stop now also prints its event loop's lag
# (voxflow_api_event_loop_lag_seconds: on the 2-core dev machine its 10 ms timer woke > 5 ms late only 3.5% of the
# time while each hop took ~10 ms: many short loop turns a hop, not long stalls).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small h11_0                                                     # (the first server compiles the kernels)
pack_results
for run in fast_1 h11_1 fast_2 h11_2; do
  (( SECONDS < ${UNTIL:-480} )) || break
  if [[ $run == fast_* ]]; then http_small $run --http httptools --loop uvloop; else http_small $run; fi
  pack_results
done
grep -H "" $R/loop_lag_*.txt
wrap_up "steps_http_*.jsonl*" 20
