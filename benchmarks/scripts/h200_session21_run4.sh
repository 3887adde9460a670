#!/usr/bin/env bash
# Session 21 call 4 (the session's last ~250 s of device time). `bash benchmarks/scripts/stamp_tree.sh` first; carry
# [".whl", ".device_tree"]. About 110 s: 0.6B c=64 (2.4 GB pool, codec calls of <= 16) with the layers fused at
# construction and the codec cast whole (its fp32 segments freed), its footprint; then the engine GPU tests with
# whatever time is left (cut by the timeout).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
bench_small_8gb kv2p4gb_fused_at_build --engine-arg kv_cache_bytes=2400000000
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb_fused_at_build.json.gz"
echo "  at ${SECONDS}s"
gpu_tests $((135 - SECONDS)) tests/gpu/test_gpu_engine.py
echo "done at ${SECONDS}s"
