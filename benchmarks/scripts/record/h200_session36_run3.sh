#!/usr/bin/env bash
# Session 36 call 3 (the session's last ~770 s of device time); carry [".whl", ".device_tree"].
# The HTTP figures on today's defaults (codec_tail_chunk=5 + codec_call_rows=16 since session 35, CP_SPLIT_PREFILL
# since call 1; last HTTP c=16 / c=64 runs: session 32): 1.7B over HTTP at c=1, 16, 64 and c=1 again on one server,
# then the 0.6B c=64 (<= 8 GB) offline once more.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK
if serve_variant defaults; then
  bench_http_at 1 c1_defaults
  bench_http_at 16 c16_defaults
  pack_results
  bench_http_at 64 c64_defaults
  bench_http_at 1 c1_defaults_again
  stop_server defaults
fi
pack_results
wait $CK6
bench_small_traced defaults
pack_results
echo "done at ${SECONDS}s"
