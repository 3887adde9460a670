#!/usr/bin/env bash
# Session 47, call 3; carry [".whl", ".device_tree"]. ~260 s.
# 0.6B c=64 over HTTP, ABBA: the API process on uvicorn's defaults here (h11, asyncio) / httptools + uvloop
# (`voxflow serve --http httptools --loop uvloop`). Call 1's traces: ~36 ms a request from the engine's final record to
# its replacement's add over HTTP against ~16 offline (relay 5.6, HTTP and client 11.5, intake 7.3 ms of a first
# packet); a model-less run on a 2-core CPU (benchmarks/scripts/api_path_load.py) turned over in ~14 ms with
# httptools + uvloop against ~21 with h11 + asyncio. Compare audio-s/s, TTFP p50 / p99, the traces' turnover.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
pack_results
http_small h11_1
http_small fast_1 --http httptools --loop uvloop
http_small fast_2 --http httptools --loop uvloop
http_small h11_2
summarize_steps "steps_http_*.jsonl*" 20
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
grep -h "TTFP went" $R/*.md | grep -v slowest
pack_results
echo "done at ${SECONDS}s"
