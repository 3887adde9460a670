#!/usr/bin/env bash
# Session 42 call 3; carry [".whl", ".device_tree"]. ~200 s.
# The 0.6B c=64 target over HTTP again, in the configuration the offline figures use (a 2.4 GB KV pool): call 2's
# server had a 2 GB pool (serve_small's old default), which holds ~54 of the 64 requests (its step trace: waves of
# 54 admissions, mean 42.7 decode rows a step), so its 564 audio-s/s measured the pool, not the server. Then the same
# server without the preloaded text rows (preload_text_rows=false: ~0.29 GiB less, prompt rows projected per request),
# whose whole footprint should fall under 8e9 bytes (the 2.4 GB pool's peak reads 7.62 GiB = 8.18e9 bytes); then the
# offline bench on the same machine.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
if serve_small pool24; then
  bench_http_small pool24
  bench_http_small pool24_again
  stop_server pool24
fi
pack_results
if serve_small no_preload --engine-arg preload_text_rows=false; then
  bench_http_small no_preload
  bench_http_small no_preload_again
  stop_server no_preload
fi
pack_results
bench_small_traced offline
for f in $R/health_*.json; do echo "$f"; python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['engine']; \
print('  peak total GiB', round(e['peak_gpu_memory_total_bytes'] / 2**30, 3), 'bytes', e['peak_gpu_memory_total_bytes'])" "$f"; done
summarize_steps "steps_*" 16
echo "done at ${SECONDS}s"
