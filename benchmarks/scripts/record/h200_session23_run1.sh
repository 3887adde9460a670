#!/usr/bin/env bash
# Session 23 call 1 (prepared in session 22). Results: benchmarks/results/h200/2026-12-03-session23/call1.
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 300 s. The HTTP server
# (1.7B, 64 seqs) with codec_sms="auto", the new default: c=64 throughput and p99 first-audio latency (the target:
# >= 600 audio-s/s, p99 <= 300 ms), then c=1.
# Then, if time is left, 0.6B c=64 with the codec's regular chunks spread thinner (codec_frames_per_step 100 instead
# of 400): in the bench's lock-step waves 64 chunks fall due on the same step, and 400 frames a step puts them on 4
# steps of every 25; on its partition the codec then overlaps the following steps (call 3: steps without codec work
# 5.93 -> 6.41 ms). The results are packed after each part, in case the call is cut.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http --label http-c64 --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64.json.gz
  echo "  at ${SECONDS}s"
  bench_http --label http-c1 --concurrency 1 --num-prompts 16 --num-warmups 2 --output $R/h200_1p7b_http_c1.json.gz
fi
stop_server auto
pack_results
wait $CK6
bench_small_traced auto
pack_results
bench_small_traced fps100 --engine-arg codec_frames_per_step=100
echo "done at ${SECONDS}s"
