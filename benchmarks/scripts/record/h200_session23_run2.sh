#!/usr/bin/env bash
# Session 23 call 2 (prepared in session 22; ran on the machine still warm from call 1). Results:
# benchmarks/results/h200/2026-12-03-session23/call2. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl",
# ".device_tree"]. About 330 s.
# The codec's SM share for the 1.7B: session 22 measured only 64 SMs ("auto") against the whole GPU there (1.7B
# offline c=64: 633.7 against 600.5 audio-s/s); the 0.6B's sweep (call 2) put 64 first, 96 second, 48 third. Here
# 48, 80 and 96 SMs beside auto and the whole GPU, 1.7B offline c=64 (192 prompts of 151 frames), all on one machine,
# then the 0.6B with codec_frames_per_step=200 beside auto (call 1 had 100).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg

wait $CK
bench_1p7b_c64 auto
bench_1p7b_c64 whole --engine-arg codec_sms=none
bench_1p7b_c64 sms48 --engine-arg codec_sms=48
bench_1p7b_c64 sms80 --engine-arg codec_sms=80
bench_1p7b_c64 sms96 --engine-arg codec_sms=96
wait $CK6
bench_small_traced auto
bench_small_traced fps200 --engine-arg codec_frames_per_step=200
gzip -f $R/steps_*.jsonl
echo "done at ${SECONDS}s"
