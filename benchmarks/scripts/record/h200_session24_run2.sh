#!/usr/bin/env bash
# Session 24 call 2 (prepared in session 23; ran on tree f71c7f3 in 204 s).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 450 s.
# The targets not re-measured since the codec partition became the default (session 22): the HTTP server (1.7B,
# 64 seqs) at c=16 (target: TTFP p99 <= 100 ms, no underruns; last measured in session 17: 53 ms) and c=64 again on
# another machine (session 23 call 1: 615.1 audio-s/s, p99 217 ms), then offline c=256, the best concurrency
# (target >= 1,000 audio-s/s; session 19: 1,223.8). The results are packed after each part.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http_at 16 c16
  bench_http_at 64 c64
fi
stop_server auto
pack_results
bench_offline auto
echo "done at ${SECONDS}s"
