#!/usr/bin/env bash
# Session 31 call 1; carry [".whl", ".device_tree"]. Session 30's prepared h200_next_run.sh and h200_next_run2.sh,
# reordered so that the largest open question comes first:
# 1. GPU tests of the select's stop after 16 key bits (select_tokens.HALF_EXIT, default on since session 30, not
#    yet run on a GPU) and the fp32 engine against the CPU reference;
# 2. probe_stream_overlap.py under 8 and 32 hardware work queues: does a short graph on the talker's kind of stream
#    wait for a long one on the codec's?
# 3. 1.7B c=1 bench A/B (step traces): the defaults; the talker on its own highest-priority stream; 32 hardware work
#    queues; the codec's green context on its own work queues. Session 30: steps launching a codec chunk 4.43 ms
#    against 3.10 without, ~98 us a step on average, the distance to RTF 0.04.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
gpu_tests 200 tests/gpu/test_gpu_select_tokens.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
echo "  at ${SECONDS}s"
for n in 8 32; do
  CUDA_DEVICE_MAX_CONNECTIONS=$n timeout 80 python3 benchmarks/scripts/probe_stream_overlap.py 2>&1 \
    | grep -v -i warn | tee -a $R/probe_stream_overlap.txt
done
echo "  at ${SECONDS}s"
pack_results
wait $CK
bench_1p7b_at 1 defaults
pack_results
bench_1p7b_at 1 talker_own_stream --engine-arg talker_high_priority=true
pack_results
(export CUDA_DEVICE_MAX_CONNECTIONS=32; bench_1p7b_at 1 max_connections32)
pack_results
(export VOXFLOW_CODEC_WORKQUEUE=balanced; bench_1p7b_at 1 workqueue_balanced)
summarize_steps "steps_1p7b_c1_*.jsonl" 9
grep -A3 "^==" $R/step_summaries.txt | head -40
echo "done at ${SECONDS}s"
