#!/usr/bin/env bash
# Prepared in session 62 (which got no machine) as h200_next_intake.sh; ran in session 63 as call 1 on an H100
# (through h200_next_pick.sh, 455 s on a fresh machine; carry [".whl", ".device_tree"]). Calls 2-3 reran it without
# the GPU test (h200_session63_call2.sh, h200_session63_call3.sh).
# 0.6B c=64 over HTTP in <= 8 GB, alternating until UNTIL (default 360 s; ~36 s a run), then the switch's GPU test:
#   e: the defaults;  i: intake_while_waiting (the requests that arrive during a step taken in while the host waits
#   for the decode in flight, their prompts built then, instead of after the step: session 61's step traces show
#   prompt builds of 4-9 ms a wave edge on the engine thread with the GPU run dry: collect_decode ~0.03 ms after
#   them);  j: i with emit_while_waiting (the finals that land during the wait leave then, so the replacements
#   come sooner: neutral alone in session 51);  l / m: the codec's SM share 56 / 72 (of 132; auto gives 64).
# The codec share alone (session 61's planned sweep; the share was last swept in session 22 on an H200, on a codec
# ~30% slower): RUNS="e_1 l_1 m_1 e_2 l_2 m_2 e_3".
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  case $1 in
    i_*) http_small "$1" --engine-arg intake_while_waiting=true ;;
    j_*) http_small "$1" --engine-arg intake_while_waiting=true --engine-arg emit_while_waiting=true ;;
    l_*) http_small "$1" --engine-arg codec_sms=56 ;;
    m_*) http_small "$1" --engine-arg codec_sms=72 ;;
    *) http_small "$1" ;;
  esac
}
runs=(${RUNS:-i_1 e_1 j_1 i_2 e_2 j_2 i_3 e_3 l_1 m_1})
alternate "${UNTIL:-360}" "${runs[@]}"
gpu_tests 100 tests/gpu/test_gpu_engine.py -k arrivals     # the switch's GPU test: the CPU loop's codes and audio
pack_results
grep -H "ran dry" "$R"/*.md
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
