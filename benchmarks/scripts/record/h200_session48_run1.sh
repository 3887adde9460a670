#!/usr/bin/env bash
# Session 48 call 1 (prepared in session 47); carry [".whl", ".device_tree"]. ~380 s.
# The <= 8 GB 0.6B server's KV pool: 2.4 GB = 1,307 pages of 16 positions, and 64 requests of ~168 prompt positions
# + 151 frames need ~1,280-1,340 of them at a wave's end: every offline run of sessions 45-47 preempted 8 requests
# (their positions recomputed, the requests finishing late). /health reports preemptions now (session 47), so the
# HTTP runs say whether they preempt too. ABBA over HTTP: the pool at 2.4 GB / 2.5 GB (+54 pages, +0.1 GB: the
# whole footprint must stay under 8e9 bytes; session 47's peak was 7.89e9). Compare audio-s/s, TTFP, the bench
# report's preemption line, the footprint, the turnover line of each trace. Then a cProfile of the engine thread's
# wave-edge host work (benchmarks/scripts/profile_wave_edge_host.py).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
pack_results
bench_small_traced offline_kv24                                   # (compiles the kernels: the first server's wait)
http_small kv24_1
http_small kv25_1 --engine-arg kv_cache_bytes=2500000000
http_small kv25_2 --engine-arg kv_cache_bytes=2500000000
http_small kv24_2
# where the engine thread's ~0.7 ms a new request goes at a wave's edge (builds, prefill phase), on this host
timeout 150 python3 benchmarks/scripts/profile_wave_edge_host.py /tmp/real-0.6b 3 8 kv_cache_bytes=2400000000 \
  preload_text_rows=false codec_max_batch=16 2>&1 | grep -v -i warn > $R/profile_wave_edge_host.txt
grep "ms a request" $R/profile_wave_edge_host.txt
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
grep -h "preemptions" $R/*.md
for f in $R/health_*.json; do echo "$f $(grep -o '"peak_gpu_memory_total_bytes":[0-9]*' $f)"; done
pack_results
echo "done at ${SECONDS}s"
