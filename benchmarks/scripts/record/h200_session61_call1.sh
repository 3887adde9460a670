#!/usr/bin/env bash
# Session 61 call 1 (an H100, asked as nvidia-h200; 590 s; prepared in session 60 as h200_next_ab3.sh). ~560 s on a
# fresh machine; carry [".whl", ".device_tree"].
# First, while the checkpoint is made: the GPU test of skinny_linear's split-K fixup (passed on session 60's H100;
# the k runs are left out if it fails).
# Then 0.6B c=64 over HTTP in <= 8 GB, alternating three variants on one machine until UNTIL (default 470 s; each
# server compiles its kernels before it is ready; ~40-50 s a run):
#   d: today's defaults (the code predictor's GEMMs on skinny_linear + PDL since session 59): on an H200 this is also
#      the 0.6B target (>= 800 audio-s/s in <= 8 GB) under today's defaults;
#   k: + VOXFLOW_SKINNY_SPLIT_K_BELOW=96 (skinny_linear's N = 1024 GEMMs at 9..64 rows, the code predictor's o_proj
#      and down_proj, split along K in two with the in-kernel fixup: 128 programs instead of 64; session 60's probe:
#      a layer pass's chain 27.31 against 28.04 us);
#   h: + VOXFLOW_SKINNY_HEADS=1 (the code predictor's 15 heads a step and the talker's codec_head on skinny_linear +
#      PDL at 9..64 / 2..64 rows). (Session 60's one pair with k and h at once: 751.0 against 748.3 / 758.8, full-step
#      median 5.27 against 5.35 / 5.37 ms: within the noise of one pair.)
#   t: + VOXFLOW_TALKER_SKINNY_GEMMS=1 (session 59's switch), not in the default list: RUNS="d_0 t_1 d_1 t_2 d_2".
# RUNS (space-separated) replaces the run list.
# Then the heads' engine test (fp32 codes equal the CPU loop's) until TEST_UNTIL (default 570 s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
runs=(${RUNS:-d_0 k_1 h_1 d_1 k_2 h_2 d_2 k_3 h_3 d_3})
timeout 90 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_skinny_linear.py -k fixup \
  > "$R/gpu_tests_fixup.txt" 2>&1
rc=$?
tail -2 "$R/gpu_tests_fixup.txt"
if (( rc != 0 )); then
  echo "the fixup test failed (rc $rc): no k runs"
  runs=($(printf '%s\n' "${runs[@]}" | grep -v "^k_"))
fi
wait $CK6
variant() {
  case $1 in
    k_*) VOXFLOW_SKINNY_SPLIT_K_BELOW=96 http_small "$1" ;;
    h_*) VOXFLOW_SKINNY_HEADS=1 http_small "$1" ;;
    t_*) VOXFLOW_TALKER_SKINNY_GEMMS=1 http_small "$1" ;;
    *) http_small "$1" ;;
  esac
}
alternate "${UNTIL:-470}" "${runs[@]}"
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
if (( SECONDS < ${TEST_UNTIL:-570} )); then
  gpu_tests $(( ${TEST_UNTIL:-570} + 20 - SECONDS )) tests/gpu/test_gpu_engine.py -k "skinny_heads"
  pack_results
fi
echo "done at ${SECONDS}s"
