#!/usr/bin/env bash
# Ran on tree 2899e61 in 130 s. VOXFLOW_BATCH_SKINNY no longer exists (removed in ecb2178); its benches ran on the
# repeated bundled prompts (UNIQUE= set empty reruns them as they ran).
# Session 25 call 2 (tree as call 1: 2899e61). About 420 s. Call 1's step profile: 0.6B c=64 5.64 -> 5.23 ms a step
# with VOXFLOW_BATCH_SKINNY=1. The A/B in throughput, one machine: 0.6B c=64 in the <= 8 GB configuration and the
# 1.7B offline c=64, each with the switch off and on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
wait $CK6
for on in 0 1 ; do
  export VOXFLOW_BATCH_SKINNY=$on
  bench_small_traced skinny$on
done
pack_results
wait $CK
for on in 0 1 ; do
  export VOXFLOW_BATCH_SKINNY=$on
  bench_1p7b_at 64 skinny$on
done
echo "done at ${SECONDS}s"
