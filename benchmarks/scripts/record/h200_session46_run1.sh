#!/usr/bin/env bash
# Session 46 call 1; carry [".whl", ".device_tree"]. ~590 s, in the order of what matters (the call may be cut).
# 1. Each residual-unit convolution of a 16-stream 25-frame codec call in fp16 (the served dtype), by channel count:
#    where the waveform stack's time goes; the 96- / 192-channel ones also with the TMA kernel's columns in two
#    accumulators (VOXFLOW_CONV_SPLIT_N: no masked columns) against its one 128-column tile.
# 2. Served, offline 0.6B c=64 (<= 8 GB, traced): defaults / split-N / defaults / split-N.
# 3. 0.6B c=64 over HTTP, one server, 640 prompts, with the better of the two (by the mean of its two runs): the
#    target row on this GPU (session 44's 741.1 was an H100). This tree also keys a burst's prompts together
#    (position_keys_many): compare the traces' prompt-build time with session 45's 259-265 ms.
# 4. The codec call alone (16 streams, 64 SMs, 1 / 5 / 25 frames) with and without VOXFLOW_CONV_SPLIT_N.
# 5. A kernel timeline of 0.6B c=64 steps (step_timeline.py), the cuBLAS layout probe (probe_gemm_layouts.py).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
timeout 90 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float16 > $R/conv_cost_fp16.txt 2>&1
cut -c1-220 $R/conv_cost_fp16.txt | head -12
pack_results
wait $CK6
bench_small_traced defaults_1
VOXFLOW_CONV_SPLIT_N=1 bench_small_traced split_n_1
bench_small_traced defaults_2
VOXFLOW_CONV_SPLIT_N=1 bench_small_traced split_n_2
summarize_steps "steps_0p6b_*.jsonl" 20
pack_results
mean_of() { for f in "$@"; do grep -h "^| c=64" "$f" | awk -F'|' '{print $7}'; done | awk '{s += $1} END {print s / NR}'; }
base=$(mean_of $R/h200_0p6b_offline_c64_defaults_{1,2}.md)
split=$(mean_of $R/h200_0p6b_offline_c64_split_n_{1,2}.md)
echo "offline means: defaults $base, split-N $split"
if awk "BEGIN {exit !($split > $base)}"; then
  VOXFLOW_CONV_SPLIT_N=1 http_small split_n
else
  http_small defaults
fi
pack_results
export CODEC_MODEL=/tmp/real-0.6b
profile_codec_16 defaults
profile_codec_16 split_n VOXFLOW_CONV_SPLIT_N=1
pack_results
# (as session 40 call 2 recorded it on the H100: staggered arrivals so that the codec runs beside the talker)
timeout 100 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 "$R/timeline_small_c64.json.gz" \
  --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v -i warn | tail -3
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64.json.gz" --sequence \
  > "$R/timeline_small_c64.txt"
head -1 "$R/timeline_small_c64.txt"
pack_results
timeout 60 python3 benchmarks/scripts/probe_gemm_layouts.py > $R/probe_gemm_layouts.txt 2>&1
cut -c1-300 $R/probe_gemm_layouts.txt
echo "done at ${SECONDS}s"
