#!/usr/bin/env bash
# Session 32 call 3; carry [".whl", ".device_tree"]. The tree with calls 1-2's kernels on by default (the talker's
# input in one kernel, with the sum of the frame's rows; the talker's c0 draw at 16 warps) and a step's frames
# queued to the codec when the step is queued (engine._queue_frames: a first chunk leaves behind the decode of its
# frame, a length-limited request's final chunk behind its last decode, their host-side codec launch done while the
# talker runs). 1. GPU tests: the fp32 engine against the CPU reference, no host sync, the select at 16 warps;
# 2. 1.7B c=1 offline and over HTTP (the target's setting); 3. 0.6B c=64 (<= 8 GB) and 1.7B c=64 (that the
# earlier chunk timing costs nothing under load); 4. a cProfile of the prompt builds at c=1.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 240 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" \
  "tests/gpu/test_gpu_no_host_sync.py::test_gpu_serving_loop_has_no_hidden_synchronisation[custom_voice]" \
  tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_frame_input.py
echo "  at ${SECONDS}s"
pack_results
wait $CK
bench_1p7b_at 1 defaults
pack_results
if serve_variant c1_defaults; then
  bench_http_at 1 c1_defaults
  stop_server c1_defaults
fi
pack_results
wait $CK6
bench_small_traced defaults
pack_results
bench_1p7b_at 64 c64_defaults
pack_results
# where the prompt build's ~2 ms of host time goes at c=1 (on every request's critical path; cProfile, so this run's
# latencies read high): steps_1p7b_c1_profprep.jsonl.prepare.pstats
bench_1p7b_at 1 profprep --engine-arg trace_profile_prepare=true
echo "done at ${SECONDS}s"
