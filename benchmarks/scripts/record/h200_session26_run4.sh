#!/usr/bin/env bash
# Session 26 call 4: packed prefill sizes 512 apart past 1024 (1536 ... 3584 added). Call 3's HTTP c=16 first
# packet p50 went 62 -> 82 ms with the 4096-position step budget: 16 new prompts (2.2-3.1k positions) ran the 4096
# graph. All on unique prompts:
# 1. a served 1.7B (64 seqs): HTTP c=1, c=16, c=64 (against call 3 and session 25 call 5), its startup record
#    (prefill graph count and capture seconds);
# 2. offline c=256 (the best-concurrency run: call 2 1,123.8 at 4096 positions a step);
# 3. the 0.6B <= 8 GB configuration's footprint and c=64 with the added graphs.
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"].
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
wait $CK
if serve_variant sizes512; then
  bench_http_at 1 c1_sizes512
  bench_http_at 16 c16_sizes512
  bench_http_at 64 c64_sizes512
fi
stop_server sizes512
grep -o "'prefill_graph_capture_seconds': [0-9.]*, 'prefill_graphs': [0-9]*\|'startup_seconds': [0-9.]*" \
  $R/serve_log_sizes512.txt
pack_results
bench_offline sizes512
pack_results
wait $CK6
bench_small_traced sizes512
echo "done at ${SECONDS}s"
