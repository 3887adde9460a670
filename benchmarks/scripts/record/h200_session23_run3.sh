#!/usr/bin/env bash
# Session 23 call 3. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 330 s.
# The codec's call sizes at 0.6B c=64 (<= 8 GB configuration), all on one machine. Calls 1-2 spread the regular
# chunks thinner (codec_frames_per_step 100 / 200 instead of 400): 647 / 684 against 695-697 audio-s/s, so more,
# smaller codec calls cost more. Here the other way: regular chunks of 50 frames instead of 25 (half the calls),
# no per-step cap, and calls of up to 32 requests instead of 16 (its footprint must stay under 8 GB = 7.45 GiB).
# The baseline runs first and again last, to show the machine's drift.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
bench_small_traced auto
pack_results
bench_small_traced chunk50 --engine-arg chunk_frames=50
pack_results
bench_small_traced fpsnone --engine-arg codec_frames_per_step=none
pack_results
bench_small_traced codec32 --engine-arg codec_max_batch=32
pack_results
bench_small_traced auto2
echo "done at ${SECONDS}s"
