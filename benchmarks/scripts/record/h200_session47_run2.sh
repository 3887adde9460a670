#!/usr/bin/env bash
# Session 47, call 2; carry [".whl", ".device_tree"]. ~330 s, in the order of what matters (the call may be cut).
# 1. GPU test of the background prompt builds (engine/prompt_builder.py): the engine's stream waits for each build's
#    event (a build held back by a sleep kernel on the builder's stream still gives the CPU loop's codes).
# 2. 0.6B c=64 over HTTP, ABBA: the defaults / background_builds=true (call 1: the engine thread built prompts for
#    191-235 ms a run while the GPU waited at each wave's edge), then background builds with preload_text_ids=16384
#    and that warm start alone. Compare audio-s/s, TTFP p99, the traces' rows in use and builds, the footprint.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 100 tests/gpu/test_gpu_engine.py -k "background_builds"
wait $CK6
pack_results
http_small defaults_1
http_small bg_1 --engine-arg background_builds=true
http_small bg_2 --engine-arg background_builds=true
http_small defaults_2
http_small bg_warm --engine-arg background_builds=true --engine-arg preload_text_ids=16384
http_small warm --engine-arg preload_text_ids=16384
summarize_steps "steps_http_*.jsonl*" 20
grep -h "prompt builds" $R/step_summaries.txt
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
pack_results
echo "done at ${SECONDS}s"
