#!/usr/bin/env bash
# Ran on tree bceeb86 in 221 s, on the repeated bundled prompts (UNIQUE= set empty reruns it as it ran: c16_again
# repeats the first c=16's prompts only then). Its HTTP reports lack the prefix-cache line: /health did not carry the
# counters yet (b72ee65).
# Session 25 call 4. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 330 s.
# The 1.7B targets on this session's defaults (preloaded text rows), one fresh HTTP server: c=1, c=16, c=64, then
# c=16 again (the same prompts as the first c=16), and offline c=256 (best concurrency). The bench draws every
# level's prompts from the 66 bundled ones in one order, so later levels (and c=64's 256 prompts) repeat earlier
# prompts.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
if serve_variant auto; then
  bench_http_at 1 c1
  bench_http_at 16 c16
  bench_http_at 64 c64
  bench_http_at 16 c16_again
fi
stop_server auto
pack_results
bench_offline auto
echo "done at ${SECONDS}s"
