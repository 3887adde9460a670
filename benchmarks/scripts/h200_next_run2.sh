#!/usr/bin/env bash
# Prepared in session 43; carry [".whl", ".device_tree"]; rename when run. ~330 s. JOINT=1: CP_JOINT_PREFILL on.
# Issue 6's 1.7B target rows re-measured under the benchmarking rules' >= 10 x c prompts (device_lib.sh
# PROMPTS_PER_USER: c=1 16, c=16 160, c=64 640, offline c=256 2,560): the README's rows ran 3-4 x c (c=16: 64,
# c=64: 192-256, c=256: 512), where each client's first arrival and last tail weighed a third of its cycles.
# 1. 1.7B over HTTP, one server (64 seqs, streamed PCM on loopback): c=1, c=16, c=64, with its step trace.
# 2. 1.7B offline at c=256 (256 seqs): the best-concurrency row.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
export VOXFLOW_CP_JOINT_PREFILL=${JOINT:-0}
start_call 1.7B
echo "CP_JOINT_PREFILL=$VOXFLOW_CP_JOINT_PREFILL" | tee $R/switches.txt
wait $CK
if serve_variant targets; then
  bench_http_at 1 c1
  bench_http_at 16 c16
  bench_http_at 64 c64
  stop_server targets
fi
pack_results
grep -h "^| c=" $R/h200_1p7b_http_*.md
bench_offline targets
print_footprint $R/h200_1p7b_offline_c256_targets.json.gz
echo "done at ${SECONDS}s"
