#!/usr/bin/env bash
# Session 20 call 2. `bash benchmarks/scripts/stamp_tree.sh` first; `git archive b8bdba5 voxflow -o .old_voxflow.tar`
# (the engine before FrameRows, for the A/B); carry [".whl", ".device_tree", ".old_voxflow.tar"]; one archive back.
# About 560 s:
#  1. the GPU tests (the codec stage now hands the codec rows of its steps' frames: engine/frame_rows.py);
#  2. probe_stack_growth.py, 0.6B with the 2.4 GB pool: which op or kernel grows the per-thread stack limit (call 1:
#     5,344 B after startup, 1.1 GiB of local memory), whether anything after the load needs more than 1,024 B, and
#     the allocator's reservation by startup stage;
#  3. 0.6B c=64 (2.4 GB pool), the engine before FrameRows (b8bdba5) then this tree, with and without
#     shrink_stack_after_load (the stack limit back to its value of before the load, before any graph is captured);
#  4. profile_host_step.py, 0.6B c=64: where the engine thread's host time goes now;
#  5. HTTP c=64 (1.7B) with this tree.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
mkdir -p /tmp/old && tar -xf .old_voxflow.tar -C /tmp/old
gpu_tests 200 tests/gpu
echo "  at ${SECONDS}s"
wait $CK6
python3 benchmarks/scripts/probe_stack_growth.py /tmp/real-0.6b 64 kv_cache_bytes=2400000000 codec_max_batch=16 \
  2>&1 | grep -v Warning | tee $R/probe_stack_growth.txt | tail -40
echo "  at ${SECONDS}s"
small() {   # LABEL [ARGS]: bench_small_8gb with a 2.4 GB pool and a step trace
  bench_small_8gb "$1" --engine-arg kv_cache_bytes=2400000000 --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl "${@:2}"
  print_footprint "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}
(cd /tmp/old && small before_frame_rows)      # the old package first on sys.path (the working directory)
small frame_rows
small frame_rows_no_shrink --engine-arg shrink_stack_after_load=false
gzip -f $R/steps_0p6b_*.jsonl
python3 benchmarks/scripts/profile_host_step.py /tmp/real-0.6b 64 200 kv_cache_bytes=2400000000 codec_max_batch=16 \
  > $R/profile_host_step_0p6b_c64.txt 2>&1
head -3 $R/profile_host_step_0p6b_c64.txt
echo "  at ${SECONDS}s"
wait $CK
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "done at ${SECONDS}s"
