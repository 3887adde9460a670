#!/usr/bin/env bash
# Prepared in session 49 for the next call; carry [".whl", ".device_tree"]; rename when run. ~470 s.
# Where a served 0.6B c=64 run's turnover goes over HTTP, hop by hop: the server's request trace (`voxflow serve
# --trace-requests`, request_trace.py) joined with the bench's records (`sent_clock_s`, `worker`) by
# voxflow/tools/http_turn.py: the final record's relay, the API -> client, the client, client -> API, the handler,
# the engine's intake, the build. Session 49: a replaced request's turn 34.3 row-ms over HTTP against 17-21 offline
# (idle rows 345 ms a run against 135-177), 2% of the throughput. First the model-less path (api_path_load.py,
# which now prints the same split), then the served runs, h11 + asyncio against httptools + uvloop (session 47:
# faster model-less, not served; the split says which hop each moves).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
timeout 120 python3 benchmarks/scripts/api_path_load.py --per-user 6 2>&1 | grep -v -i warn | tee $R/api_path_load_h11.txt
timeout 120 python3 benchmarks/scripts/api_path_load.py --per-user 6 --http httptools --loop uvloop 2>&1 \
  | grep -v -i warn | tee $R/api_path_load_fast.txt
pack_results
wait $CK6
bench_small_first off_0                                              # (compiles the kernels)
http_small h11_1
http_small fast_1 --http httptools --loop uvloop
http_small h11_2
http_small fast_2 --http httptools --loop uvloop
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
