#!/usr/bin/env bash
# Session 32 call 4; carry [".whl", ".device_tree"]. The final tree (call 3's) over HTTP, the targets' setting:
# c=1 again (call 3: RTF 0.0399), c=16 (first packet p99 <= 100 ms, no underruns) and c=64 (>= 600 audio-s/s, first
# packet p99 <= 300 ms, no underruns) with the frames now queued to the codec with their step; then c=1 offline again.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
if serve_variant final; then
  bench_http_at 1 final
  pack_results
  bench_http_at 16 final_c16
  pack_results
  bench_http_at 64 final_c64
  stop_server final
fi
pack_results
bench_1p7b_at 1 final
echo "done at ${SECONDS}s"
