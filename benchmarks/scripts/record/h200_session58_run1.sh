#!/usr/bin/env bash
# Prepared in session 57; ran as session 58 call 1 (on an H100). ~420 s; carry [".whl", ".device_tree"].
# The 0.6B c=64 target (>= 800 audio-s/s in <= 8 GB) over HTTP on the H200 under the 8-chunk layout, the default
# since session 57 (chunk_ramp_factor 2 + codec_tail_chunk 10: +1.4% on an H100, every stream whole), alternating
# with the old layout (factor 1, tail pieces of 5) for the same machine's baseline: d_0 (compiles) f1_1 d_1 f1_2 d_2
# (UNTIL, default 360 s, stops the loop). Then h200_next_run3.sh (the 1.7B under the new layout) if time is left.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
variant() {
  if [[ $1 == f1_* ]]; then
    http_small "$1" --engine-arg chunk_ramp_factor=1 --engine-arg codec_tail_chunk=5
  else
    http_small "$1"
  fi
}
alternate "${UNTIL:-360}" f1_1 d_1 f1_2 d_2
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
echo "done at ${SECONDS}s"
