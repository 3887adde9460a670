#!/usr/bin/env bash
# Prepared in session 59; rename when run. ~480 s on a fresh machine; carry [".whl", ".device_tree"].
# The talker's folded layer GEMMs on skinny_linear + PDL (VOXFLOW_TALKER_SKINNY_GEMMS=1, built in session 59 after
# the code predictor's same switch gained 3.5% served) against today's defaults, 0.6B c=64 over HTTP in <= 8 GB,
# alternating: d_0 t_1 d_1 t_2 d_2 until UNTIL (default 380 s; each server compiles its kernels before it is ready;
# d_0 is also the 0.6B target under today's defaults). Then the switch's GPU tests (the engine's fp32 codes against
# the CPU loop with it on; the talker's interpreter check runs in CI) and, with the code predictor's switch on by
# default, the code predictor's GPU tests, until TEST_UNTIL (default 470 s).
# Then, if time is left (PROBE_UNTIL, default 520 s), probe_gemms_beside_codec.py at the 1.7B talker's widths.
# If it wins on the 0.6B: the 1.7B talker (twice as wide) needs its own A/B before the switch is made the default.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  if [[ $1 == t_* ]]; then VOXFLOW_TALKER_SKINNY_GEMMS=1 http_small "$1"; else http_small "$1"; fi
}
alternate "${UNTIL:-380}" d_0 t_1 d_1 t_2 d_2
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
if (( SECONDS < ${TEST_UNTIL:-470} )); then
  gpu_tests $(( ${TEST_UNTIL:-470} + 100 - SECONDS )) tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_cp_layer.py \
    -k "talker_skinny or folded_norms or test_gpu_cp_layer"
  pack_results
fi
probe_gemms "${PROBE_UNTIL:-520}" 80 probe_gemms_talker_1p7b --rounds 2 --shape talker-1.7b   # (wider GEMMs gain?)
echo "done at ${SECONDS}s"
