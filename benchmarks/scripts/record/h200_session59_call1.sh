#!/usr/bin/env bash
# Prepared in session 59 as h200_session59_call3.sh; ran as session 59 call 1 (an H100), with UNTIL=330
# TEST_UNTIL=360 PROBE_UNTIL=300. ~560 s on a fresh machine with the defaults below; carry [".whl", ".device_tree"].
# One call for what the session's device time allowed (its first calls found no machine): the 0.6B c=64 target
# (>= 800 audio-s/s in <= 8 GB over HTTP) under today's defaults, alternating with the code predictor's GEMMs on
# skinny_linear + PDL (VOXFLOW_CP_SKINNY_GEMMS=1; cuBLAS's GEMM kernels cannot take part in PDL, session 58):
# d_0 s_1 d_1 s_2 d_2 until UNTIL (default 420 s; each server compiles its kernels before it is ready), then the
# switch's GPU test (TEST_UNTIL, default 480 s) and probe_gemms_beside_codec.py (PROBE_UNTIL, default 480 s) if time
# is left.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  if [[ $1 == s_* ]]; then VOXFLOW_CP_SKINNY_GEMMS=1 http_small "$1"; else http_small "$1"; fi
}
alternate "${UNTIL:-420}" d_0 s_1 d_1 s_2 d_2          # (each server compiles what it needs before it is ready)
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
if (( SECONDS < ${TEST_UNTIL:-480} )); then
  gpu_tests 100 tests/gpu/test_gpu_cp_layer.py -k skinny_gemms
  pack_results
fi
probe_gemms "${PROBE_UNTIL:-480}" 100 probe_gemms_beside_codec --rounds 2
echo "done at ${SECONDS}s"
