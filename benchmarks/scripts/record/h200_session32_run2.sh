#!/usr/bin/env bash
# Prepared in session 31 for the next session's second call; carry [".whl", ".device_tree"]. After
# h200_session32_run1.sh: the 1.7B c=1 A/B of the talker-input kernel on one machine (off, on, on + the sum of the
# frame's rows; then with the talker's draw at 4 / 16 warps), then HTTP c=1 with both on (the target's setting:
# session 31 RTF 0.0407 there, 0.0403 offline).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
bench_1p7b_at 1 defaults
pack_results
(export VOXFLOW_FRAME_INPUT_KERNEL=1; bench_1p7b_at 1 frame_input)
pack_results
(export VOXFLOW_FRAME_INPUT_KERNEL=1 VOXFLOW_FRAME_SUM_KERNEL=1; bench_1p7b_at 1 frame_input_sum)
pack_results
# the talker's c0 draw at 16 warps (call 1's sweep: 11.5 us against 13.2 at 8 warps, 19.5 at 4)
for w in 16; do
  (export VOXFLOW_FRAME_INPUT_KERNEL=1 VOXFLOW_FRAME_SUM_KERNEL=1 VOXFLOW_TALKER_SELECT_WARPS=$w
   bench_1p7b_at 1 frame_input_sum_talker_w$w)
  pack_results
done
export VOXFLOW_FRAME_INPUT_KERNEL=1 VOXFLOW_FRAME_SUM_KERNEL=1
if serve_variant c1_frame_input_sum; then
  bench_http_at 1 c1_frame_input_sum
  stop_server c1_frame_input_sum
fi
echo "done at ${SECONDS}s"
