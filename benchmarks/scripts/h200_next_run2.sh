#!/usr/bin/env bash
# Prepared in session 30 for the next session's second call; carry [".whl", ".device_tree"].
# The codec beside a c=1 decode (session 30 call 4's bench trace, `python -m voxflow.tools.step_trace_summary`):
# decode steps without codec work 3.10 ms (mean), the 180 of 2,735 that launch a codec chunk 4.43 ms, those with
# a chunk still running 3.19: ~98 us a step on average, the whole distance to RTF 0.04. Call 5's timeline shows
# why: the next decode step's graph, launched ~1 ms before, started only when the codec stream's whole call (its
# graph replay, then the PCM copy) had finished -- the two streams serialised, not sharing SMs. Suspects: the
# talker on the legacy default stream, or both streams on one hardware work queue. A/Bs of the 1.7B c=1 bench
# (RTF; then the summary of each trace): the defaults; the talker on its own (highest-priority) stream; 32 hardware
# work queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8); the codec's green context on its own work queues
# (VOXFLOW_CODEC_WORKQUEUE=balanced). h200_next_run3.sh: the same at 0.6B c=64.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
bench_1p7b_at 1 defaults
pack_results
bench_1p7b_at 1 talker_own_stream --engine-arg talker_high_priority=true
pack_results
(export CUDA_DEVICE_MAX_CONNECTIONS=32; bench_1p7b_at 1 max_connections32)
pack_results
(export VOXFLOW_CODEC_WORKQUEUE=balanced; bench_1p7b_at 1 workqueue_balanced)
for f in $R/steps_1p7b_c1_*.jsonl; do echo "== $f"; python3 -m voxflow.tools.step_trace_summary $f | head -9; done \
  | tee $R/step_summaries.txt
echo "done at ${SECONDS}s"
