#!/usr/bin/env bash
# Prepared in session 31 (its device time spent) for the next session's first call; carry [".whl", ".device_tree"].
# Rename to h200_sessionNN_run1.sh when run.
# 1. GPU tests of the talker-input kernel (kernels/frame_input.py, off by default until this has run: the frame
#    embedding + trailing-text row and the positions in one kernel instead of ~9 torch kernels, ~18 us of the c=1
#    step's critical path in session 30's timeline), and the fp32 engine against the CPU reference with it on;
# 2. bench_select_tokens.py: the talker's c0 draw at 4 / 8 / 16 warps with the select's stop on / off (31 us on
#    the c=1 step's critical path, the code predictor's draws ~10);
# 3. profile_codec_launch.py: where a codec launch's ~1 ms of host time goes (on every request's critical path
#    for its first and its final chunk);
# 4. 1.7B c=1 bench: the defaults, then the talker-input kernel on (twice); HTTP c=1 with it on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
gpu_tests 150 tests/gpu/test_gpu_frame_input.py
mv $R/gpu_tests.txt $R/gpu_tests_frame_input.txt
(export VOXFLOW_FRAME_INPUT_KERNEL=1
 gpu_tests 150 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference")
mv $R/gpu_tests.txt $R/gpu_tests_engine_frame_input.txt
echo "  at ${SECONDS}s"
timeout 100 python3 benchmarks/scripts/bench_select_tokens.py 2>&1 | grep -v -i warn | tee $R/bench_select_tokens.txt
pack_results
wait $CK
timeout 150 python3 benchmarks/scripts/profile_codec_launch.py /tmp/real-1.7b > $R/profile_codec_launch.txt 2>&1
head -4 $R/profile_codec_launch.txt
pack_results
bench_1p7b_at 1 defaults
pack_results
(export VOXFLOW_FRAME_INPUT_KERNEL=1; bench_1p7b_at 1 frame_input; bench_1p7b_at 1 frame_input_again)
pack_results
export VOXFLOW_FRAME_INPUT_KERNEL=1
if serve_variant c1_frame_input; then
  bench_http_at 1 c1_frame_input
  stop_server c1_frame_input
fi
echo "done at ${SECONDS}s"
