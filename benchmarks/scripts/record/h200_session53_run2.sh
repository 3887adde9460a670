#!/usr/bin/env bash
# Prepared in session 51; run in session 53 as call 2 (warm H200); carry [".whl", ".device_tree"]. ~480 s.
# The paged decode attention's tensor-core loop became pipelined by default in session 51 (0.6B c=64 offline +6% on
# an H100, alternating); the 1.7B was not run with it. The tensor-core variant serves batches of >= 17 rows, so c=1
# and c=16 keep the CUDA-core variant; c=64 takes it. Here the 1.7B c=64 offline A/B (VOXFLOW_PAGED_DECODE_STAGES=1,
# the old loop, against the default), alternating, and c=1 as a check that nothing else moved.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
BENCH_LIMIT=330 bench_1p7b_c64 piped_0                               # (compiles the kernels)
pack_results
VOXFLOW_PAGED_DECODE_STAGES=1 bench_1p7b_c64 plain_1
bench_1p7b_c64 piped_1
VOXFLOW_PAGED_DECODE_STAGES=1 bench_1p7b_c64 plain_2
pack_results
bench_1p7b_at 1 piped
wrap_up "steps_*.jsonl*" 40
