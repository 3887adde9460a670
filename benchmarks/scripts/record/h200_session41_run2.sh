#!/usr/bin/env bash
# Prepared in session 32, run as session 41 call 2 (commit 59542f5, under its old name h200_next_run2.sh); carry
# [".whl", ".device_tree"].
# The step's copies inside its CUDA graph (graph_runner.GRAPH_COPIES, off until this has run: the inputs' copy in
# and the flags' copy out captured in the graph, one graph per shape and staging buffer; ~18 us of gaps around the
# step's three copies in session 30's c=1 timeline, two of them gone): 1. GPU tests (the fp32 engine against the
# CPU reference with it on, both flips replayed; no host sync with it on); 2. 1.7B c=1 off / on / off (one
# machine; session 32: 475.4-475.8 ms offline); 3. 0.6B c=64 off / on; startup's capture time is in each bench's
# JSON (graph_capture_seconds: twice the decode graphs with it on). Session 33 added to the GPU tests: codec calls
# of one request (codec_call_rows=1) on two slots, with first chunks waiting for a codec state, against the CPU loop.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 300 "tests/gpu/test_gpu_engine.py::test_gpu_graph_copies_engine_equals_cpu_reference" \
  "tests/gpu/test_gpu_no_host_sync.py::test_gpu_serving_loop_has_no_hidden_synchronisation[custom_voice-graph_copies]" \
  "tests/gpu/test_gpu_engine.py::test_gpu_codec_calls_of_one_request_on_two_slots_equal_cpu_reference" \
  tests/test_graph_runner.py
echo "  at ${SECONDS}s"
pack_results
wait $CK
bench_1p7b_at 1 defaults
(export VOXFLOW_GRAPH_COPIES=1; bench_1p7b_at 1 graph_copies)
bench_1p7b_at 1 defaults_again
pack_results
wait $CK6
bench_small_traced defaults
(export VOXFLOW_GRAPH_COPIES=1; bench_small_traced graph_copies)
echo "done at ${SECONDS}s"
