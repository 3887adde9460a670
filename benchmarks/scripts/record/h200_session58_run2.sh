#!/usr/bin/env bash
# Prepared in session 57; ran as session 58 call 2 (a warm H100 after call 1). ~200 s;
# carry [".whl", ".device_tree"]. Session 57's one pair of served runs with the codec's upsample stages over rows
# (VOXFLOW_CODEC_UPSAMPLE_CL=1) lost 1.3-2.6% at 0.6B c=64, though the codec call alone was 2-6% faster and host
# phases the path never touches were slower too. This settles it: the defaults (d_*) against rows (r_*), ABAB
# (UNTIL, default 190 s, stops the loop), with the step summaries' host phases.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
( while sleep 15; do pack_results; done ) &                   # (a call cut mid-way keeps what was printed)
PACKER=$!
variant() {
  if [[ $1 == r_* ]]; then VOXFLOW_CODEC_UPSAMPLE_CL=1 http_small "$1"; else http_small "$1"; fi
}
alternate "${UNTIL:-190}" d_1 r_1 d_2 r_2
kill $PACKER
summarize_steps "steps_http_*.jsonl*" 20
report_runs
pack_results
echo "done at ${SECONDS}s"
