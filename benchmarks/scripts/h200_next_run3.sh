#!/usr/bin/env bash
# Prepared in session 30 for the next session's third call; carry [".whl", ".device_tree"].
# h200_next_run2.sh's settings at 0.6B c=64 (<= 8 GB configuration, ~690-700 audio-s/s against the 800 target):
# there the steps that launch codec work are the slow ones too (sessions 20-23), so if the talker and the codec
# streams serialise on a work queue, a fix should show here as well. The defaults; the talker on its own
# (highest-priority) stream; CUDA_DEVICE_MAX_CONNECTIONS=32; the codec's green context on its own work queues.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
bench_small_traced defaults
pack_results
bench_small_traced talker_own_stream --engine-arg talker_high_priority=true
pack_results
(export CUDA_DEVICE_MAX_CONNECTIONS=32; bench_small_traced max_connections32)
pack_results
(export VOXFLOW_CODEC_WORKQUEUE=balanced; bench_small_traced workqueue_balanced)
for f in $R/steps_0p6b_*.jsonl; do echo "== $f"; python3 -m voxflow.tools.step_trace_summary $f | head -9; done \
  | tee $R/step_summaries.txt
echo "done at ${SECONDS}s"
