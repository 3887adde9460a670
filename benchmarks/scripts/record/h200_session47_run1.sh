#!/usr/bin/env bash
# Prepared in session 46, run in session 47 (call 1); carry [".whl", ".device_tree"]. ~260 s, in the order of
# what matters (the call may be cut).
# 1. GPU tests of session 46's split-N convolutions (on by default since its H100 A/B): the same bits as the one-tile
#    kernel at the codec's shapes, the fp16 stack's SNR; with the TMA and fp16 streaming tests beside them.
# 2. 0.6B c=64 over HTTP (the target row), alternating: the defaults / preload_text_ids=16384 (session 46: the
#    first wave's prompt builds 43.8 ms over HTTP, where the <= 8 GB server keeps no preloaded table and projects a
#    text's ids on first sight, against ~12 ms offline with the table). Compare audio-s/s, TTFP p99, the traces'
#    first-wave builds (steps_http_*), and the whole footprint (must stay under 8e9 bytes).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
gpu_tests 200 tests/gpu/test_gpu_codec.py -k "split_n or tma_convolutions or fp16_streaming"
pack_results
http_small defaults_1
http_small warm_1 --engine-arg preload_text_ids=16384
http_small defaults_2
http_small warm_2 --engine-arg preload_text_ids=16384
summarize_steps "steps_http_*.jsonl*" 20
grep -h "prompt builds" $R/step_summaries.txt
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
pack_results
echo "done at ${SECONDS}s"
