#!/usr/bin/env bash
# Session 27 call 4 (tree 50448a0, 231 s); carry [".whl", ".device_tree"]. The weight prefetch it measured
# was slower and is removed (its code, tune_l2_prefetch.py included, is in bd3d134).
# The code predictor's weights brought into L2 ahead of its fused one-row kernels by a side branch of the graph
# (voxflow/kernels/l2_prefetch.py, VOXFLOW_L2_PREFETCH=N kernels ahead, off by default until this has run):
# 1. its GPU test (same bits on / off, eager and graphed; the prefetches issued);
# 2. a predict frame at one row for 0-3 kernels ahead (tune_l2_prefetch.py);
# 3. 1.7B c=1 off / 1 / 2 ahead (RTF target 0.04: 0.044).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_l2_prefetch.py
timeout 150 python3 benchmarks/scripts/tune_l2_prefetch.py 2>&1 | grep -v Warn | tee $R/tune_l2_prefetch.txt | tail -5
pack_results
wait $CK
bench_1p7b_at 1 off
VOXFLOW_L2_PREFETCH=1 bench_1p7b_at 1 pf1
VOXFLOW_L2_PREFETCH=2 bench_1p7b_at 1 pf2
echo "done at ${SECONDS}s"
