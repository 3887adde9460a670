#!/usr/bin/env bash
# Prepared in session 49 for the call after h200_next_run1.sh / run2.sh (a warm machine: kernels compiled); carry
# [".whl", ".device_tree"]; rename when run. ~350 s.
# `emit_while_waiting` (voxflow/engine/engine.py, off): while the host waits for the decode in flight (~5 ms of a
# 0.6B c=64 step, session 49's traces: collect_decode 7.8 of 9.4 s a run) it polls the codec and sends the chunks
# that land, and the finals they complete, at once, not at the step's end. What it should move: the first chunk's
# `first_chunk` / `relay` parts (Server-Timing), the turn's `relay_final` hop (http_turn), the turn's row-ms, and
# with them throughput over HTTP. Its GPU test first, then HTTP ABAB (traced, request traces on), one offline pair.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 200 tests/gpu/test_gpu_engine.py -k "while_the_host_waits"
wait $CK6
http_small off_1
http_small on_1 --engine-arg emit_while_waiting=true
http_small off_2
http_small on_2 --engine-arg emit_while_waiting=true
bench_small_traced offline_off
bench_small_traced offline_on --engine-arg emit_while_waiting=true
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
