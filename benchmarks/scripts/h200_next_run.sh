#!/usr/bin/env bash
# Prepared in session 24 (NOT YET RUN; rename it to the session's run name once it has run, and keep it as that
# call's record). `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 300 s.
# Why a fresh server's first HTTP c=16 run is ~2x slower at p99 than its second (session 24 call 6: prepare 16.5 vs
# 3.7 ms mean, host-side): a fresh 1.7B model's prompt builds of the bench's 64 measured prompts, first sight
# against second, cProfile of the first (profile_prepare_cold.py). On a CPU (tiny checkpoint) the first pass
# projected new text ids in 25 of 32 builds (text_rows.py) and took 7.1 ms a build against 2.1; on the GPU the
# projection is a small GEMM, so the host's gather, pinned copies and launches decide. If the text rows are the
# cost, warm them at start-up (the most frequent ids: the low ids of Qwen's BPE) and measure the first run again.
# First, the corrected teardown test (frames freed after their partitioned runner; session 24's review found that
# call 4's version freed them first) and the partition's equality test.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_codec.py -k "partition or partitioned"
wait $CK
timeout 150 python3 benchmarks/scripts/profile_prepare_cold.py /tmp/real-1.7b 64 cuda > $R/prepare_cold_1p7b.txt 2>&1
head -12 $R/prepare_cold_1p7b.txt
echo "done at ${SECONDS}s"
