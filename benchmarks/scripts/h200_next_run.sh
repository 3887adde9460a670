#!/usr/bin/env bash
# Prepared in session 30 (its device time spent) for the next session's first call; carry [".whl", ".device_tree"].
# 1. GPU tests of the select's stop after 16 key bits (select_tokens.HALF_EXIT, on) and of the one-row codec_head
#    through the skinny GEMM (talker.SKINNY_CODEC_HEAD, off until measured): the draws against the reference, the
#    fp32 engine's codes against the CPU reference with each;
# 2. bench_select_tokens.py: the talker's c0 draw with the stop on / off (32 us on the c=1 step's critical path in
#    session 30's timeline);
# 3. probe_stream_overlap.py: whether a short graph on the talker's kind of stream waits for a long one on the
#    codec's (green context, plain stream, own work queues), under 8 and 32 hardware work queues;
# 4. 1.7B c=1 step timelines: defaults, the stop off, the skinny codec_head on; the bench of the defaults.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
gpu_tests 200 tests/gpu/test_gpu_select_tokens.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
mv $R/gpu_tests.txt $R/gpu_tests_defaults.txt
(export VOXFLOW_SKINNY_CODEC_HEAD=1
 gpu_tests 120 "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference")
mv $R/gpu_tests.txt $R/gpu_tests_skinny_codec_head.txt
echo "  at ${SECONDS}s"
timeout 100 python3 benchmarks/scripts/bench_select_tokens.py 2>&1 | grep -v -i warn | tee $R/bench_select_tokens.txt
# do the talker's and the codec's streams overlap, or does the talker wait (session 30's c=1 timeline)?
for n in 8 32; do
  CUDA_DEVICE_MAX_CONNECTIONS=$n timeout 90 python3 benchmarks/scripts/probe_stream_overlap.py 2>&1 \
    | grep -v -i warn | tee -a $R/probe_stream_overlap.txt
done
pack_results
wait $CK
timeline_at /tmp/real-1.7b 1 1p7b_c1_defaults
timeline_at /tmp/real-1.7b 1 1p7b_c1_half_exit_off VOXFLOW_SELECT_HALF_EXIT=0
timeline_at /tmp/real-1.7b 1 1p7b_c1_skinny_codec_head VOXFLOW_SKINNY_CODEC_HEAD=1
pack_results
bench_1p7b_at 1 defaults
echo "done at ${SECONDS}s"
