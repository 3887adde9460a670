#!/usr/bin/env bash
# Prepared in session 59; rename when run. ~400 s on a warm machine (one that ran the 0.6B and compiled its kernels);
# carry [".whl", ".device_tree"].
# The code predictor's GEMMs on skinny_linear + PDL (VOXFLOW_CP_SKINNY_GEMMS=1) served against the defaults (cuBLAS),
# 0.6B c=64 over HTTP in <= 8 GB, alternating: s_1 d_1 s_2 d_2 (UNTIL, default 380 s, stops it), then the GPU test
# that holds the switch to the cuBLAS path's logits. Run it where probe_gemms_beside_codec.py showed the skinny
# chain no slower than cuBLAS's beside the codec; the first skinny server compiles its kernels (~1 min more).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  if [[ $1 == s_* ]]; then VOXFLOW_CP_SKINNY_GEMMS=1 http_small "$1"; else http_small "$1"; fi
}
alternate "${UNTIL:-380}" s_1 d_1 s_2 d_2
gpu_tests 120 tests/gpu/test_gpu_cp_layer.py -k skinny_gemms
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
echo "done at ${SECONDS}s"
