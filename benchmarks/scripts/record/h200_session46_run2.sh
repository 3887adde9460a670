#!/usr/bin/env bash
# Session 46 call 2 (the warm machine of call 1, ~130 s): the split-N served A/B again with 192 k=1 left on one tile
# (call 1's conv costs: 0.133 -> 0.153 ms split there, every other shape faster).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
ls /tmp/real-0.6b > /dev/null || exit 1
bench_small_traced defaults_3
VOXFLOW_CONV_SPLIT_N=1 bench_small_traced split_n_3
bench_small_traced defaults_4
VOXFLOW_CONV_SPLIT_N=1 bench_small_traced split_n_4
summarize_steps "steps_0p6b_*_[34].jsonl" 20
echo "done at ${SECONDS}s"
