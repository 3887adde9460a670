#!/usr/bin/env bash
# Prepared at the end of session 21, run as session 22 call 2 (its record), after call 1's GPU test of the SM
# partition passed. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 400 s.
# The lever for 0.6B c=64 >= 800 audio-s/s: the codec's kernels confined to a share of the SMs (`codec_sms`, a CUDA
# green context: engine/sm_partition.py), so that the talker's small per-frame kernels never wait for an SM behind a
# codec block (steps with codec work take 10.6-11 ms against ~6 without). The codec needs ~1.7 ms of the whole GPU
# a step at c=64 (26 us a stream-frame in 16 x 25-frame calls): on 48 of 132 SMs ~4.7 ms, under a ~6 ms step.
# One call, one machine: the default, then 96, 64, 48 and 32 SMs for the codec (2.4 GB pool, codec calls of <= 16).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
bench_small_traced default
bench_small_traced codec_sms96 --engine-arg codec_sms=96
bench_small_traced codec_sms64 --engine-arg codec_sms=64
bench_small_traced codec_sms48 --engine-arg codec_sms=48
bench_small_traced codec_sms32 --engine-arg codec_sms=32
gzip -f $R/steps_0p6b_*.jsonl
echo "done at ${SECONDS}s"
