#!/usr/bin/env bash
# Prepared in session 58 (session 59 got no H200 for it); rename when run. ~330 s; carry [".whl", ".device_tree"].
# The 0.6B c=64 target (>= 800 audio-s/s in <= 8 GB over HTTP) under today's defaults: the 8-chunk layout (since
# session 57), the upsample stages over rows and the API's startup objects frozen (since session 58), the code
# predictor's GEMMs on skinny_linear + PDL (since session 59: 785.3-787.5 on an H100, +3.5%). No H200 has run these
# yet: sessions 57-59 got only H100s (session 53's H200 gave 777.9 under the old layout, ~3% above an H100).
# d_0 compiles; then d_1 d_2 d_3 until UNTIL (default 300 s). Where time is left on a warm machine:
# probe_gemms_beside_codec.py (~60 s), whose beside-the-codec column session 59 could not read.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
variant() { http_small "$1"; }
alternate "${UNTIL:-300}" d_1 d_2 d_3
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
probe_gemms "${PROBE_UNTIL:-330}" 90 probe_gemms_beside_codec --rounds 2
echo "done at ${SECONDS}s"
