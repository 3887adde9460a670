#!/usr/bin/env bash
# Prepared in session 36 (its device time ran out: the machine for call 4 stopped answering); carry [".whl",
# ".device_tree"]. Rename to h200_sessionNN_runK.sh when run. ~400 s.
# FOLDED_NORMS_PAGED (voxflow/layers/qwen3_layer.py; session 17's 74dda5e brought back, off): the talker's layer
# steps above the skinny sizes with both norms folded into q|k|v and gate|up, as the code predictor's. Session 17
# call 4 measured it much slower (1.7B c=64 full steps 6.51 -> 8.17 ms; 0.6B c=64 564.5 -> 482.9) and never said
# why: its profile ran out of time. At the 0.6B the talker's GEMMs have the code predictor's shapes, where the fold
# is a gain; it would cut two norm launches a layer step (56 a step). This call: the GPU test (fp32 engine with it
# on == the CPU loop), 0.6B c=64 (<= 8 GB) off / on with step traces and footprints, a kernel timeline with it on
# (what the step spends, against session 36 call 1's), then 1.7B c=64 off / on. With it on the loader folds the
# talker's norm weights into its weights in place (folded_norms.fold_norms_in_place): no folded copies, the same
# footprint (the bench lines print it).
# Added in session 40: `talker_high_priority=true` (the talker on a highest-priority stream) A/B at 0.6B c=64. It was
# last measured in session 8, before the codec's green context (session 22): then a running codec block held every
# SM; now the codec's blocks stay on its 64 SMs and the talker's blocks meet them only there, where a priority could
# put a talker block ahead of the codec's next one whenever one ends.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 120 "tests/gpu/test_gpu_engine.py::test_gpu_talker_folded_norms_engine_equals_cpu_reference"
pack_results
wait $CK6
# The SM clock and power every 100 ms through the first bench: whether the talker's kernels run slower beside the
# codec's because the GPU clocks down under its tensor-core load (power) rather than for want of SMs or bandwidth.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,clocks_event_reasons.active \
  --format=csv -lms 100 > "$R/clocks_0p6b_defaults.csv" 2>&1 &
SAMPLER=$!
bench_small_traced defaults
kill $SAMPLER
python3 - "$R/clocks_0p6b_defaults.csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and r[0][:1].isdigit()]
mhz = [float(r[1].split()[0]) for r in rows]
watts = [float(r[3].split()[0]) for r in rows if r[3].split()[0].replace(".", "").isdigit()]
busy = [float(r[1].split()[0]) for r in rows if r[4].split()[0].isdigit() and int(r[4].split()[0]) >= 90]
print(f"SM clock MHz min {min(mhz):.0f} median {statistics.median(mhz):.0f} max {max(mhz):.0f}; busy (>= 90% util) "
      f"median {statistics.median(busy or [0]):.0f} min {min(busy or [0]):.0f} of {len(busy)}; "
      f"power W median {statistics.median(watts):.0f} max {max(watts):.0f}; {len(rows)} samples")
PY
(export VOXFLOW_FOLDED_NORMS_PAGED=1; bench_small_traced talker_folded)
bench_small_traced priority --engine-arg talker_high_priority=true
bench_small_traced defaults_again
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
VOXFLOW_FOLDED_NORMS_PAGED=1 timeout 100 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 \
  "$R/timeline_small_c64_stagger_folded.json.gz" --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 \
  | grep -v -i warn | tail -1
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64_stagger_folded.json.gz" \
  > "$R/timeline_small_c64_stagger_folded.txt"
head -1 "$R/timeline_small_c64_stagger_folded.txt"
pack_results
wait $CK
bench_1p7b_at 64 c64_defaults
(export VOXFLOW_FOLDED_NORMS_PAGED=1; bench_1p7b_at 64 c64_talker_folded)
pack_results
echo "done at ${SECONDS}s"
