#!/usr/bin/env bash
# Prepared in session 58; ran as session 58 call 6 (an H100: the rows A/B). ~450 s; carry [".whl", ".device_tree"].
# What it runs depends on the card:
# - an H200: the 0.6B c=64 target (>= 800 audio-s/s in <= 8 GB over HTTP) under the 8-chunk layout (the default
#   since session 57), alternating with the old layout (factor 1, tail pieces of 5): d_0 (compiles) f1_1 d_1 f1_2 d_2.
#   No H200 has run the new layout yet (sessions 57-58 got H100s: 754-765 against 748-754).
# - an H100: more runs of the upsample stages over rows (VOXFLOW_CODEC_UPSAMPLE_CL=1) against the defaults, after the
#   compile run: r_1 d_1 r_2 d_2 r_3 d_3. Session 58's ABAB gave 764.8 / 763.5 against 765.0 / 755.1 (noise ~1%).
# UNTIL (default 400 s) stops the alternation.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
if grep -q H200 "$R/gpu.txt"; then
  variant() {
    if [[ $1 == f1_* ]]; then
      http_small "$1" --engine-arg chunk_ramp_factor=1 --engine-arg codec_tail_chunk=5
    else
      http_small "$1"
    fi
  }
  alternate "${UNTIL:-400}" f1_1 d_1 f1_2 d_2
else
  variant() {
    if [[ $1 == r_* ]]; then VOXFLOW_CODEC_UPSAMPLE_CL=1 http_small "$1"; else http_small "$1"; fi
  }
  alternate "${UNTIL:-400}" r_1 d_1 r_2 d_2 r_3 d_3
fi
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
echo "done at ${SECONDS}s"
