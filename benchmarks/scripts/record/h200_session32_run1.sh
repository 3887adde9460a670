#!/usr/bin/env bash
# Prepared in session 31 (its device time spent) for the next session's first call; carry [".whl", ".device_tree"].
# Run as session 32 call 1; h200_session32_run2.sh follows.
# 1. GPU tests of the talker-input kernel (kernels/frame_input.py, off by default until this has run: the frame
#    embedding + trailing-text row and the positions in one kernel instead of ~9 torch kernels, ~18 us of the c=1
#    step's critical path in session 30's timeline; with VOXFLOW_FRAME_SUM_KERNEL=1 also the sum of the frame's 16
#    embedding rows, ~8 us more), and the fp32 engine against the CPU reference with each on;
# 2. bench_select_tokens.py: the talker's c0 draw at 4 / 8 / 16 warps with the select's stop on / off (31 us on
#    the c=1 step's critical path, the code predictor's draws ~10);
# 3. profile_codec_launch.py: where a codec launch's ~1 ms of host time goes (on every request's critical path
#    for its first and its final chunk);
# 4. 1.7B c=1 bench: the defaults, then the talker-input kernel on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
# (+ what landed after session 31's last call, untimed: the select's greedy argmax for greedy rows only and its
# in-place seen read, the RoPE lookup as one gather; the fp32 engine with the defaults; no host sync in a step)
gpu_tests 240 tests/gpu/test_gpu_frame_input.py tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_rotary_table.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" \
  "tests/gpu/test_gpu_no_host_sync.py::test_gpu_serving_loop_has_no_hidden_synchronisation[custom_voice]"
mv $R/gpu_tests.txt $R/gpu_tests_frame_input.txt
(export VOXFLOW_FRAME_INPUT_KERNEL=1
 gpu_tests 120 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
 mv $R/gpu_tests.txt $R/gpu_tests_engine_frame_input.txt
 export VOXFLOW_FRAME_SUM_KERNEL=1
 gpu_tests 120 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
 mv $R/gpu_tests.txt $R/gpu_tests_engine_frame_sum.txt)
echo "  at ${SECONDS}s"
timeout 100 python3 benchmarks/scripts/bench_select_tokens.py 2>&1 | grep -v -i warn | tee $R/bench_select_tokens.txt
pack_results
wait $CK
timeout 120 python3 benchmarks/scripts/profile_codec_launch.py /tmp/real-1.7b > $R/profile_codec_launch.txt 2>&1
head -4 $R/profile_codec_launch.txt
pack_results
bench_1p7b_at 1 defaults
pack_results
(export VOXFLOW_FRAME_INPUT_KERNEL=1; bench_1p7b_at 1 frame_input)
echo "done at ${SECONDS}s"
