#!/usr/bin/env bash
# Prepared in session 56; since session 57 the 8-chunk layout (chunk_ramp_factor=2 + codec_tail_chunk=10) is the
# default (0.6B c=64 on an H100: +1.4%, every stream whole). Ran as session 58 call 3 (a warm H100). ~480 s;
# carry [".whl", ".device_tree"].
# The 1.7B targets over HTTP under the default layout (one server, 64 seqs, streamed PCM on loopback): c=64 first
# (where no underruns is a target), then c=1 (first-packet latency: the first chunk is unchanged, 5 frames) and c=16;
# then the old layout (factor 1, tail pieces of 5) at c=64 on a second server for the same machine's baseline, if
# time is left (UNTIL, default 420 s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
if serve_variant f2; then
  bench_http_at 64 c64_f2
  pack_results
  bench_http_at 1 c1_f2
  bench_http_at 16 c16_f2
  stop_server f2
fi
pack_results
grep -h "^| c=" $R/h200_1p7b_http_*.md
grep -H "ran dry" $R/*.md
OLD_LAYOUT=(--engine-arg chunk_ramp_factor=1 --engine-arg codec_tail_chunk=5)
if (( SECONDS < ${UNTIL:-420} )) && serve_variant f1 "${OLD_LAYOUT[@]}"; then
  bench_http_at 64 c64_f1
  stop_server f1
fi
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" $R/*.md
pack_results
echo "done at ${SECONDS}s"
