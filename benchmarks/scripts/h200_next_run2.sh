#!/usr/bin/env bash
# Prepared in session 41; carry [".whl", ".device_tree"]. Rename to h200_sessionNN_runK.sh when run. ~300 s.
# The 0.6B c=64 target as issue 6 states it: streamed PCM over HTTP on loopback (`voxflow serve` + `voxflow bench
# --base-url`), in the <= 8 GB configuration (a 2 GB KV pool, codec calls of <= 16), which no session has measured:
# every 0.6B figure so far is the offline bench (engine in the bench's process; session 36's H200: 709.0-714.8). At
# 1.7B c=64 HTTP ran 5-7% below offline (609.9 against 643-654, sessions 26 / 36). Two HTTP runs on one server
# (the server's step trace, /health with its whole GPU footprint), then the offline bench on the same machine; the
# step traces say whether the serving process's host phases (chunks out over IPC and HTTP) slow its steps.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
if serve_small defaults; then
  bench_http_small defaults
  bench_http_small defaults_again
  stop_server defaults
fi
pack_results
bench_small_traced offline
summarize_steps "steps_*" 16
echo "done at ${SECONDS}s"
