#!/usr/bin/env bash
# Prepared in session 34; carry [".whl", ".device_tree"]. Run as session 35 call 2, right after
# h200_session35_run1.sh (same machine: its /tmp/real-0.6b is reused when the machine is still warm, else rebuilt).
# 0.6B c=64, one machine: defaults / talker_gemm_sms=rest on every step (the plan alone, whatever the codec does) /
# rest with h200_next_run.sh's wave-end pair (codec_tail_chunk=5, codec_call_rows=16: the whole prepared stack) /
# defaults again. Add VOXFLOW_GEMM_SM_TARGET_LT=1 to the gemm runs if the first script found only cuBLASLt honours
# the target. ~330 s.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
if [ -d /tmp/real-0.6b ]; then device_setup /tmp/r; archive_results; CK6=0; else start_call 0.6B; fi
[ "$CK6" = 0 ] || wait $CK6
bench_small_traced defaults
bench_small_traced gemm_rest_all --engine-arg talker_gemm_sms=rest --engine-arg talker_gemm_sms_steps=all
pack_results
bench_small_traced gemm_rest_tail5_rows16 --engine-arg talker_gemm_sms=rest --engine-arg codec_tail_chunk=5 \
  --engine-arg codec_call_rows=16
bench_small_traced defaults_again
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
echo "done at ${SECONDS}s"
