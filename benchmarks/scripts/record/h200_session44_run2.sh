#!/usr/bin/env bash
# Session 44 call 2 (prepared in session 43; run with JOINT=1 after call 1); carry [".whl", ".device_tree"]. ~450 s.
# JOINT=1: CP_JOINT_PREFILL on for the target rows (1-2).
# Issue 6's 1.7B target rows re-measured under the benchmarking rules' >= 10 x c prompts (device_lib.sh
# PROMPTS_PER_USER: c=1 16, c=16 160, c=64 640, offline c=256 2,560): the README's rows ran 3-4 x c (c=16: 64,
# c=64: 192-256, c=256: 512), where each client's first arrival and last tail weighed a third of its cycles.
# 0. First CP_JOINT_PREFILL at one row (the four-kernel layers' joint form, built in session 43): 1.7B c=1 offline,
#    split / joint / split / joint (step traces; the c=1 step was 3.49 ms on an H100 in session 41).
# 1. 1.7B over HTTP, one server (64 seqs, streamed PCM on loopback): c=1, c=16, c=64, with its step trace.
# 2. 1.7B offline at c=256 (256 seqs): the best-concurrency row.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
for run in split_1 joint_1 split_2 joint_2; do
  case $run in joint*) export VOXFLOW_CP_JOINT_PREFILL=1 ;; *) export VOXFLOW_CP_JOINT_PREFILL=0 ;; esac
  bench_1p7b_at 1 $run
done
pack_results
export VOXFLOW_CP_JOINT_PREFILL=${JOINT:-0}
echo "CP_JOINT_PREFILL=$VOXFLOW_CP_JOINT_PREFILL for the target rows" | tee $R/switches.txt
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
