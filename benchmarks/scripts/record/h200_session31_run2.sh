#!/usr/bin/env bash
# Session 31 call 2; carry [".whl", ".device_tree"]. Call 1 found no stream serialisation (probe: every talker /
# codec stream pairing overlapped): the c=1 cost of the codec is its GPU work beside the talker's steps (each
# 25-frame chunk ~0.6 ms of talker time, the ramp's 4/8/16-frame chunks cut into 2-3 graph replays 0.8-1.2 ms)
# and the first chunk's wait with no decode queued (~2.5 ms a request). This tree: the first chunk waited for in
# the next step after its decode is queued; the ramp rounded down to the codec's one-pass sizes.
# 1. GPU tests: the fp32 engine against the CPU reference (defaults, and the one-row codec_head on the skinny GEMM);
# 2. 1.7B c=1 benches: the new defaults; + the skinny codec_head; + the codec on 32 SMs; the select's stop off;
# 3. 0.6B c=64 (<= 8 GB configuration) of the new defaults.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 150 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
mv $R/gpu_tests.txt $R/gpu_tests_defaults.txt
(export VOXFLOW_SKINNY_CODEC_HEAD=1
 gpu_tests 120 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference")
mv $R/gpu_tests.txt $R/gpu_tests_skinny_codec_head.txt
echo "  at ${SECONDS}s"
pack_results
wait $CK
bench_1p7b_at 1 defaults
pack_results
(export VOXFLOW_SKINNY_CODEC_HEAD=1; bench_1p7b_at 1 skinny_codec_head)
pack_results
bench_1p7b_at 1 codec_sms32 --engine-arg codec_sms=32
pack_results
(export VOXFLOW_SELECT_HALF_EXIT=0; bench_1p7b_at 1 half_exit_off)
pack_results
wait $CK6
bench_small_traced defaults
summarize_steps "steps_*.jsonl" 12
echo "done at ${SECONDS}s"
