#!/usr/bin/env bash
# Session 30, call 1 (prepared in session 29, when no device time was left to run it). Carry
# [".whl", ".device_tree"] (and ".whl-official" for the Base no-sync test).
# 1. probe_cp_step_chain.py: one code-predictor step in five chains that differ only before its first layer (why
#    its layers ran ~35% slower in session 29's fused first step and projected-tables steps);
# 2. 1.7B c=1 bench and step timeline of session 29's final defaults (never benched: call 5 found no device time);
# 3. 0.6B c=64 (<= 8 GB configuration).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
timeout 120 python3 benchmarks/scripts/probe_cp_step_chain.py 2>&1 | grep -v -i warn | tee $R/probe_cp_step_chain.txt
pack_results
wait $CK
bench_1p7b_at 1 defaults
timeline_at /tmp/real-1.7b 1 1p7b_c1
pack_results
wait $CK6
bench_small_traced defaults
echo "done at ${SECONDS}s"
