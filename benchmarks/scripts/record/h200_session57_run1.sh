#!/usr/bin/env bash
# Prepared in sessions 55-56, run in session 57. ~440 s; carry [".whl",
# ".device_tree"]. Ran as session 57 call 1 on an H100; calls 2-3 were h200_session57_run2.sh / run3.sh.
# 1. 0.6B c=64 over HTTP, alternating: the defaults against chunk_ramp_factor=2 + codec_tail_chunk=10 (8 chunks a
#    request: 5, 10, 25 x 5, 10), d_0 f2_1 d_1 f2_2 (UNTIL, default 330 s, stops the loop);
# 2. the GPU tests of the codec switches not yet run on a GPU: the flat TMA tiles' stack part (several streams),
#    the fused residual units in K blocks past the channels, the upsample stages over rows (session 56).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in f2_1 d_1 f2_2; do
  (( SECONDS < ${UNTIL:-330} )) || break
  if [[ $run == f2_* ]]; then
    http_small $run --engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
summarize_steps "steps_http_*.jsonl*" 20
grep -h "turnover" "$R/step_summaries.txt"
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
gpu_tests 100 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py \
  -k "one_channel or flat or fused_tma_residual or upsample_stages"
pack_results
echo "done at ${SECONDS}s"
