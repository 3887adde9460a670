#!/usr/bin/env bash
# Prepared in session 30 for the next session's second call; carry [".whl", ".device_tree"].
# The codec beside a c=1 decode (session 30 call 4's bench trace, `python -m voxflow.tools.step_trace_summary`):
# decode steps without codec work 3.10 ms (mean), the 180 of 2,735 that launch a codec chunk 4.43 ms, those with
# a chunk still running 3.19: ~98 us a step on average, the whole distance to RTF 0.04. The codec runs on 64 of
# 132 SMs beside a one-row step whose kernels spread over every SM. A/Bs of the 1.7B c=1 bench (RTF; then the
# summary of each trace): the defaults (codec_sms auto = 64), the codec on 32 and on 16 SMs, the talker's stream at
# the highest priority.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
bench_1p7b_at 1 codec64
pack_results
bench_1p7b_at 1 codec32 --engine-arg codec_sms=32
pack_results
bench_1p7b_at 1 codec16 --engine-arg codec_sms=16
pack_results
bench_1p7b_at 1 talker_priority --engine-arg talker_high_priority=true
for f in $R/steps_1p7b_c1_*.jsonl; do echo "== $f"; python3 -m voxflow.tools.step_trace_summary $f | head -9; done \
  | tee $R/step_summaries.txt
echo "done at ${SECONDS}s"
