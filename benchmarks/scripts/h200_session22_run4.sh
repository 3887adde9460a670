#!/usr/bin/env bash
# Session 22 call 4, on the session's last ~390 s of device time. `bash benchmarks/scripts/stamp_tree.sh` first;
# carry [".whl", ".device_tree"]. About 200 s. The HTTP server (1.7B, 64 seqs) with codec_sms="auto", the new
# default: c=64 throughput and p99 first-audio latency (the target: >= 600 audio-s/s, p99 < 250 ms), then c=1.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http --label http-c64 --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64.json.gz
  echo "  at ${SECONDS}s"
  bench_http --label http-c1 --concurrency 1 --num-prompts 16 --num-warmups 2 --output $R/h200_1p7b_http_c1.json.gz
fi
stop_server auto
echo "done at ${SECONDS}s"
