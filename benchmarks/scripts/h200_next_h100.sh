#!/usr/bin/env bash
# Prepared in sessions 63 and 65; once run, it moves to record/ under the call's name. What h200_next_pick.sh runs
# on a card that is not an H200 (~560 s on a fresh machine; carry [".whl", ".device_tree"]).
# 0.6B c=64 over HTTP in <= 8 GB, alternating until UNTIL (default 360 s; ~40 s a run after ~180 s of start), then
# the GPU tests of the prefill's own stream, the codec's fp16 check and Triton compiles while serving (<= 150 s):
#   e: the defaults;  j: intake_while_waiting + emit_while_waiting (session 63 on one H100: 778.6 against 773.4
#   audio-s/s over 8 / 10 runs, +0.7%, one-sided permutation p 0.15: not yet adopted);  l / m: the codec's SM share
#   56 / 72 (of 132; auto gives 64; ~10% of a run is talker steps slowed by the codec beside them, session 61);
#   p: prefill_stream (session 65: a step's prefill on its own stream beside its decode; ~5% of a run is the extra
#   time of its prefill steps, session 63), with its GPU test after the runs; q: p with steps of <= 2048 positions
#   (max_num_batched_tokens; 4096 by default), so that a wave's prefill comes in pieces shorter than a decode step.
# The codec share alone: RUNS="e_1 l_1 m_1 e_2 l_2 m_2 e_3". e / j alone: RUNS="e_1 j_1 e_2 j_2 ...". e / p alone:
# RUNS="e_1 p_1 e_2 p_2 ...". report_runs writes ab_0p6b_c64.md: each variant against e (voxflow bench ab).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  case $1 in
    j_*) http_small "$1" --engine-arg intake_while_waiting=true --engine-arg emit_while_waiting=true ;;
    l_*) http_small "$1" --engine-arg codec_sms=56 ;;
    m_*) http_small "$1" --engine-arg codec_sms=72 ;;
    p_*) http_small "$1" --engine-arg prefill_stream=true ;;
    q_*) http_small "$1" --engine-arg prefill_stream=true --engine-arg max_num_batched_tokens=2048 ;;
    *) http_small "$1" ;;
  esac
}
runs=(${RUNS:-e_1 p_1 q_1 e_2 p_2 q_2 e_3 p_3 q_3 j_1 l_1 m_1})
alternate "${UNTIL:-360}" "${runs[@]}"
# GPU tests, in this order (what the timeout cuts is the last): the prefill's own stream against the CPU loop (session
# 65; p's and q's runs mean nothing if it fails); the codec's fp16 check against its plain fp32 reference (session
# 65); no Triton compile after startup in served waves (session 63's 307 ms prefill step), and the watch on this
# Triton (its compilation listener fires for a real compile)
gpu_tests 150 -s \
  tests/gpu/test_gpu_engine.py::test_gpu_prefill_on_its_own_stream_beside_the_decode_equals_cpu_reference \
  tests/gpu/test_gpu_codec.py::test_gpu_fp16_check_holds_the_fp16_kernels_against_the_plain_fp32_decode \
  tests/gpu/test_gpu_engine.py::test_gpu_served_waves_compile_no_triton_kernel_after_startup \
  tests/test_kernel_compiles.py
pack_results
grep -H "ran dry" "$R"/*.md
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
