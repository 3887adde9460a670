#!/usr/bin/env bash
# Session 29 call 1; carry [".whl", ".device_tree"].
# Critical-path timelines (step_timeline.py: each kernel's start / end on the step's stream, 30 graph-replayed
# steps): 1.7B c=1 (the RTF 0.04 target: which kernels carry the 3.36 ms step), 0.6B c=64 in its <= 8 GB
# configuration with the arrivals staggered (codec work beside most steps, as served) and not (talker alone).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
wait $CK
timeout 150 python3 benchmarks/scripts/step_timeline.py record /tmp/real-1.7b 1 $R/timeline_1p7b_c1.json.gz 2>&1 \
  | grep -v -i warn
python3 benchmarks/scripts/step_timeline.py report $R/timeline_1p7b_c1.json.gz | head -30
pack_results
wait $CK6
small=(codec_max_batch=16 kv_cache_bytes=2400000000)
timeout 150 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 $R/timeline_0p6b_c64.json.gz \
  "${small[@]}" 2>&1 | grep -v -i warn
timeout 150 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 \
  $R/timeline_0p6b_c64_stagger.json.gz --stagger "${small[@]}" 2>&1 | grep -v -i warn
for f in 0p6b_c64 0p6b_c64_stagger; do
  python3 benchmarks/scripts/step_timeline.py report $R/timeline_$f.json.gz | head -25
done
echo "done at ${SECONDS}s"
