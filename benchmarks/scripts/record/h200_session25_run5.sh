#!/usr/bin/env bash
# Session 25 call 5. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 250 s.
# HTTP c=16 and c=64 (1.7B) on prompts no request has sent before (`voxflow bench --unique-prompts`): call 4's
# step trace showed its c=64 run computing ~9 prompt positions a request (256 prompts from the 66 bundled ones, the
# rest from the prefix cache). Then c=64 on the plain prompts again, its report's new prefix-cache line beside.
# (Ran before device_lib.sh made --unique-prompts every bench's default: rerun as it ran with UNIQUE= set empty.)
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http_at 16 c16_unique --unique-prompts
  bench_http_at 64 c64_unique --unique-prompts
  bench_http_at 64 c64_plain
fi
stop_server auto
echo "done at ${SECONDS}s"
