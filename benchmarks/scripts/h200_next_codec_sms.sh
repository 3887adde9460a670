#!/usr/bin/env bash
# Prepared in session 61; rename when run. ~330 s on a fresh machine; carry [".whl", ".device_tree"].
# The codec's SM share again, under the defaults of session 61: 0.6B c=64 over HTTP in <= 8 GB, alternating
#   e: codec_sms auto (64 of 132 SMs);  l: 56;  m: 72 (the driver's partition step is 8 SMs)
# until UNTIL (default 320 s; ~36 s a run). Why: session 61's step traces put ~10% of a run in talker steps slowed
# by the codec beside them, and its probe a 64-row layer pass's GEMM chain ~38% slower beside the codec on 64 SMs.
# The share was last swept in session 22 on an H200 (0.6B c=64: whole GPU 656, 96 SMs 681, 64 698, 48 663, 32 640
# audio-s/s; engine/sm_partition.py), on a codec ~30% slower and a talker without skinny GEMMs since.
# RUNS (space-separated) replaces the run list.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
variant() {
  case $1 in
    l_*) http_small "$1" --engine-arg codec_sms=56 ;;
    m_*) http_small "$1" --engine-arg codec_sms=72 ;;
    *) http_small "$1" ;;
  esac
}
runs=(${RUNS:-e_1 l_1 m_1 e_2 l_2 m_2 e_3})
alternate "${UNTIL:-320}" "${runs[@]}"
grep -H "ran dry" "$R"/*.md
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
