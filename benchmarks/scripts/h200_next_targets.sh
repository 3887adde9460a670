#!/usr/bin/env bash
# Prepared in sessions 61-63 (sessions 62-63 got no H200); once run, it moves to record/ under the call's name. ~530 s
# on a fresh machine; carry [".whl", ".device_tree"].
# Issue 6's target table under the defaults of session 61 (split-K on the code predictor's N = 1024 GEMMs and the
# heads on skinny_linear, adopted after +1.3% on an H100), over HTTP, on whatever card comes (the targets are the
# H200's: session 61's H100 gave the 0.6B 794.4-797.9 audio-s/s):
# 1. 0.6B c=64 in <= 8 GB, the defaults (e) alternating with intake_while_waiting + emit_while_waiting (j: +0.7% on
#    one H100 in session 63, not yet adopted) until UNTIL_SMALL (default 330 s: the start takes ~185 s, then
#    `http_small` ~40 s a run, so e_1 j_1 e_2 j_2 on a fresh machine), while the 1.7B checkpoint is made;
# 2. the 1.7B: c=1 (TTFP p50 <= 20 ms, RTF <= 0.04: 0.0398 on the H200 in session 36, marginal), c=16 (p99 <= 100
#    ms), c=64 (>= 600 audio-s/s, p99 <= 300 ms) on one server (~160 s), started only before UNTIL - 120 s
#    (UNTIL default 500 s; ~530 s in all).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B 1.7B
wait $CK6
variant() {
  case $1 in
    j_*) http_small "$1" --engine-arg intake_while_waiting=true --engine-arg emit_while_waiting=true ;;
    *) http_small "$1" ;;
  esac
}
# (with j alternating, so one H200 call also gives its A/B)
alternate "${UNTIL_SMALL:-330}" ${RUNS:-e_1 j_1 e_2 j_2 e_3 j_3}
wait $CK
if (( SECONDS < ${UNTIL:-500} - 120 )) && serve_variant big; then
  bench_http_at 1 c1
  bench_http_at 16 c16
  bench_http_at 64 c64
  stop_server big
fi
grep -H "ran dry" "$R"/*.md
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
