#!/usr/bin/env bash
# Session 28 call 5; carry [".whl", ".device_tree"].
# Where call 4's extra 0.73 GiB with the sub-pixel transposed convolutions (VOXFLOW_CODEC_SUBPIXEL=1) goes:
# probe_allocations.py on the 0.6B <= 8 GB configuration, off and on (its pools and the allocating lines).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
for v in 0 1; do
  VOXFLOW_CODEC_SUBPIXEL=$v timeout 110 python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 \
    kv_cache_bytes=2400000000 codec_max_batch=16 2>&1 | grep -v Warning > $R/probe_allocations_subpixel$v.txt
  grep -A9 "^==" $R/probe_allocations_subpixel$v.txt | head -30
  pack_results
done
echo "done at ${SECONDS}s"
