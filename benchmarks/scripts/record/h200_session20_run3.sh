#!/usr/bin/env bash
# Session 20 call 3. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 300 s:
#  1. probe_allocations.py, 0.6B (2.4 GB pool, codec calls of <= 16): the allocator's segments by pool and the live
#     tensors by the voxflow line that made them, after startup and while serving 64 requests;
#  2. 0.6B c=64 with expandable segments and the stack shrunk: the whole footprint now;
#  3. the engine and codec GPU tests, verbose (call 2 ran them inside a run of all GPU tests cut at 200 s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 kv_cache_bytes=2400000000 codec_max_batch=16 \
  2>&1 | grep -v Warning | tee $R/probe_allocations.txt | tail -80
echo "  at ${SECONDS}s"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
bench_small_8gb kv2p4gb_expandable --engine-arg kv_cache_bytes=2400000000
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb_expandable.json.gz"
unset PYTORCH_CUDA_ALLOC_CONF
echo "  at ${SECONDS}s"
gpu_tests 200 -v tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py
echo "done at ${SECONDS}s"
