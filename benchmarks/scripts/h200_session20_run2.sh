#!/usr/bin/env bash
# Session 20 call 2. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive back.
# About 250 s (a fresh machine pays Triton's JIT in the first):
#  1. probe_stack_growth.py, 0.6B with the 2.4 GB pool: which op or kernel grows the per-thread stack limit (call 1:
#     5,344 B after startup, 1.1 GiB of local memory), whether anything after the load needs more than 1,024 B, and
#     the allocator's reservation by startup stage;
#  2. profile_host_step.py, 0.6B c=64: where the engine thread's ~2 ms of codec_launch (and codec_collect) goes.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
python3 benchmarks/scripts/probe_stack_growth.py /tmp/real-0.6b 64 kv_cache_bytes=2400000000 codec_max_batch=16 \
  2>&1 | grep -v Warning | tee $R/probe_stack_growth.txt | tail -60
echo "  at ${SECONDS}s"
python3 benchmarks/scripts/profile_host_step.py /tmp/real-0.6b 64 200 kv_cache_bytes=2400000000 codec_max_batch=16 \
  > $R/profile_host_step_0p6b_c64.txt 2>&1
head -3 $R/profile_host_step_0p6b_c64.txt
echo "done at ${SECONDS}s"
