#!/usr/bin/env bash
# Session 31 call 4 (the session's last ~300 s); carry [".whl", ".device_tree"]. Call 3's 0.6B c=64 gave 674.8
# audio-s/s against call 2's 684.2 with equal decode steps (full steps 5.53 vs 5.55 ms; the difference in the
# prompt builds and prefills): an A/B of the write-back kernel on one machine, off first, then the defaults.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
(export VOXFLOW_WRITE_BACK_KERNEL=0; bench_small_traced write_back_torch)
pack_results
bench_small_traced defaults
summarize_steps "steps_*.jsonl" 9
echo "done at ${SECONDS}s"
