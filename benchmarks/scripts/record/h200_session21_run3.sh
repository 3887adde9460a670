#!/usr/bin/env bash
# Session 21 call 3. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 330 s:
#  1. probe_allocations.py, 0.6B (2.4 GB pool, codec calls of <= 16; the text table in host memory by default now)
#     with the allocator's snapshot and its whole history dumped: call 2 left ~830 MiB reserved but free in the
#     default pool of the load's stream, its cause to find here;
#  2. HTTP 1.7B c=1 and c=64 with this tree (defaults), the footprint in /health;
#  3. the engine GPU tests with what time is left (the text table in host memory is the default under them now).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
wait $CK6
python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 --dump $R/allocations_0p6b.pickle \
  kv_cache_bytes=2400000000 codec_max_batch=16 2>&1 | grep -v Warning | tee $R/probe_allocations.txt | grep -A9 "^=="
gzip -f $R/allocations_0p6b.pickle
echo "  at ${SECONDS}s"
wait $CK
if serve_variant default; then
  bench_http --label http-c1 --concurrency 1 --num-prompts 16 --num-warmups 2 --output $R/h200_1p7b_http_c1.json.gz
  bench_http --label http-c64 --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64.json.gz
fi
stop_server default
echo "  at ${SECONDS}s"
gpu_tests $((320 - SECONDS)) tests/gpu/test_gpu_engine.py
echo "done at ${SECONDS}s"
