#!/usr/bin/env bash
# Session 24 call 6 (ran on tree 099404b in 244 s).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 300 s.
# HTTP c=16 (1.7B, 64 prompts) with the codec partition (codec_sms auto, the default) and without it (none), one
# machine, two runs each: call 2 measured TTFP p99 96 ms against session 17's 53 (before the partition); does the
# codec on half the SMs cost c=16's first packets, or was call 2's host slower (its intake / prepare phases grew)?
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http_at 16 c16_auto_a
  bench_http_at 16 c16_auto_b
fi
stop_server auto
pack_results
if serve_variant none --engine-arg codec_sms=none; then
  bench_http_at 16 c16_none_a
  bench_http_at 16 c16_none_b
fi
stop_server none
grep -h "^- c=16: where TTFP went (server's Server-Timing), mean ms:" $R/h200_1p7b_http_c16_*.md
echo "done at ${SECONDS}s"
