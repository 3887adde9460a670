#!/usr/bin/env bash
# Session 61 call 4 (an H100, asked as nvidia-h200, a fresh machine; 408 s; prepared as h200_next_suite_ab.sh).
# ~560 s on a fresh machine; carry [".whl", ".device_tree"].
# 1. The whole GPU suite (six xdist workers, -v so a cut run names what passed) under the defaults of session 61:
#    the code predictor's GEMMs on skinny_linear + PDL (session 59), now also its heads and the talker's codec_head
#    (VOXFLOW_SKINNY_HEADS auto) and the N = 1024 GEMMs split along K with the in-kernel fixup
#    (VOXFLOW_SKINNY_SPLIT_K_BELOW 96). Session 61 call 2 ran it with four workers on an H100 and was cut at ~97%
#    after 260 s, every test that ended passing. Until SUITE (default 280 s), while the 0.6B checkpoint is made.
# 2. 0.6B c=64 over HTTP in <= 8 GB, alternating until UNTIL (default 480 s; ~36 s a run on a warm machine):
#      e: the defaults (on an H200 also the 0.6B target: >= 800 audio-s/s in <= 8 GB);
#      t: + VOXFLOW_TALKER_SKINNY_GEMMS=1 (the talker's folded layer steps on skinny_linear + PDL too; built in
#         session 59, never served).
#    RUNS (space-separated) replaces the run list.
# 3. probe_gemms_beside_codec.py with its codec load running in every window (fixed in session 61) until PROBE_UNTIL
#    (default 560 s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_suite "${SUITE:-280}" 6
pack_results
wait $CK6
variant() {
  case $1 in
    t_*) VOXFLOW_TALKER_SKINNY_GEMMS=1 http_small "$1" ;;
    *) http_small "$1" ;;
  esac
}
runs=(${RUNS:-e_1 t_1 e_2 t_2 e_3 t_3})
alternate "${UNTIL:-480}" "${runs[@]}"
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
probe_gemms "${PROBE_UNTIL:-560}" $(( ${PROBE_UNTIL:-560} + 30 - SECONDS )) probe_gemms_beside_codec --rounds 1
echo "done at ${SECONDS}s"
