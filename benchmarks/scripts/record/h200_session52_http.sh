#!/usr/bin/env bash
# Prepared in session 49 (renumbered in 50 and 51); run as session 52 call 2 on a warm machine, with
# VOXFLOW_PAGED_PREFILL_STAGES=2 VOXFLOW_PREFILL_TILE_ROWS=32 exported (the defaults since);
# carry [".whl", ".device_tree"].
# The <= 8 GB server's KV pool with the memory the fused residual unit gave back: session 49's HTTP server peaked at
# 7.65e9 bytes with the 2.4 GB pool (session 48: 7.87e9-7.89e9; 2.5 GB reached 8.04e9 then), and every run
# preempts 3-8 requests (a wave needs ~1,280-1,340 of the pool's 1,307 pages). 2.6 GB (1,416 pages) holds a whole
# wave. HTTP ABAB on one machine, each server's whole footprint (must stay <= 8e9 bytes) and its preemptions. Then
# a per-kernel profile of the 0.6B step at 64 rows (the code predictor is ~4.3 of a full step's ~5.75 ms alone:
# which of its ~39 kernels a pass sit furthest from the weights' bandwidth floor), the first since session 10's.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small kv24_1
http_small kv26_1 --engine-arg kv_cache_bytes=2600000000
http_small kv24_2
http_small kv26_2 --engine-arg kv_cache_bytes=2600000000
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 codec_max_batch=16 kv_cache_bytes=2400000000 \
  2>&1 | grep -v -i warn > $R/profile_step_0p6b_64.txt; head -40 $R/profile_step_0p6b_64.txt
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
