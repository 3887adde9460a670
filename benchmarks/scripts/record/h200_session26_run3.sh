#!/usr/bin/env bash
# Session 26 call 3: max_num_batched_tokens 4096 as EngineConfig's default (call 2: 1.7B offline c=256 on unique
# prompts 985 -> 1,124 audio-s/s) checked against the other targets, all on unique prompts:
# 1. a served 1.7B (64 seqs): HTTP c=1, c=16, c=64 (first packet p50 / p99, audio-s/s, underruns);
# 2. offline c=384 at the new default, c=256 at 8,192 positions a step (is 4096 the knee?);
# 3. the 0.6B <= 8 GB configuration: its footprint with the larger packed-prefill graphs, and c=64.
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"].
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
wait $CK
if serve_variant tok4k; then
  bench_http_at 1 c1_tok4k
  bench_http_at 16 c16_tok4k
  bench_http_at 64 c64_tok4k
fi
stop_server tok4k
pack_results
bench_offline_at 384 tok4k
pack_results
bench_offline_at 256 tok8k --engine-arg max_num_batched_tokens=8192
pack_results
wait $CK6
bench_small_traced tok4k
echo "done at ${SECONDS}s"
