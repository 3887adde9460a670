#!/usr/bin/env bash
# Session 26 call 2: the best-concurrency target (>= 1,000 audio-s/s, 1.7B) on unique prompts. Call 1 measured
# offline c=256 at 985.2 (session 25's 1,215.0 took 83% of its prompt positions from the prefix cache), so:
# 1. the GPU test of the preloaded text rows (not yet run on a GPU);
# 2. offline c=384 and c=512 (2C prompts, C seqs) at the default 2,048-position step budget;
# 3. c=256 with a 4,096-position budget: each wave's ~43k prompt positions in half the steps.
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"].
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_text_rows.py
wait $CK
bench_offline_at 384 unique
pack_results
bench_offline_at 512 unique
pack_results
bench_offline_at 256 tok4k --engine-arg max_num_batched_tokens=4096
echo "done at ${SECONDS}s"
