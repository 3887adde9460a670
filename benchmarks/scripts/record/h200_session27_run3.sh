#!/usr/bin/env bash
# Session 27 call 3 (tree cf5fa2e, 261 s); carry [".whl", ".device_tree"].
# Do two half-batches decoding side by side on two streams make more frames a second than one batch
# (probe_two_batches.py: E engines of C / E sequences each, stepped in turn, each talker on its own stream)?
# 0.6B in the <= 8 GB configuration's engine settings: c=64 as one engine, as two of 32, and one of 32 alone; then
# the 1.7B at c=64 as one and as two.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
wait $CK6
small=(kv_cache_bytes=2400000000 codec_max_batch=16)
for run in "64 1" "64 2" "32 1"; do
  timeout 200 python3 benchmarks/scripts/probe_two_batches.py /tmp/real-0.6b $run "${small[@]}" 2>&1 \
    | grep -v Warn | tee -a $R/probe_two_batches_0p6b.txt | grep -E "^total|host"
  echo "  at ${SECONDS}s"
done
pack_results
wait $CK
for run in "64 1" "64 2"; do
  timeout 200 python3 benchmarks/scripts/probe_two_batches.py /tmp/real-1.7b $run 2>&1 \
    | grep -v Warn | tee -a $R/probe_two_batches_1p7b.txt | grep -E "^total|host"
  echo "  at ${SECONDS}s"
done
echo "done at ${SECONDS}s"
