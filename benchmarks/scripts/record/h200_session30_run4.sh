#!/usr/bin/env bash
# Session 30, call 4. Carry [".whl", ".device_tree"].
# Call 3's probe: the exit trigger on attention_o_proj alone (VOXFLOW_PDL_EXIT=attention_o_proj) kept the served
# chain's speed (draw+proj 117.3 us a step vs 117.5) and fixed the slow ones (draw 135.8 -> 113.9, layers 133.6 ->
# 109.6); on norm_linear it cost ~1 us in the served chain. Now on the 1.7B c=1 step (timelines, timed step):
#   A  attention_o_proj                      (the code predictor's fused first step no longer slow?)
#   B  A + VOXFLOW_PROJECTED_TABLES=1        (session 29's projected input tables: no projection GEMM a step;
#                                             refuted then at 117 -> 137 us a step, which was this placement effect)
#   C  A + qk_norm_rope, D A + paged_decode, E A + combine_splits (the talker's small kernels)
# then the best two changes together, and the bench of the fastest.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
declare -A MS
try() {
  local label=$1; shift
  timeline_at /tmp/real-1.7b 1 1p7b_c1_$label "$@"
  MS[$label]=$(head -1 $R/timeline_1p7b_c1_$label.txt | sed -E 's/.*timed step ([0-9.]+) ms.*/\1/')
  echo "$label ${MS[$label]} ms: $*" | tee -a $R/choice.txt
}
lt() { python3 -c "import sys; sys.exit(0 if $1 < $2 else 1)"; }
try A VOXFLOW_PDL_EXIT=attention_o_proj
try B VOXFLOW_PDL_EXIT=attention_o_proj VOXFLOW_PROJECTED_TABLES=1
try C VOXFLOW_PDL_EXIT=attention_o_proj,qk_norm_rope
try D VOXFLOW_PDL_EXIT=attention_o_proj,paged_decode
try E VOXFLOW_PDL_EXIT=attention_o_proj,combine_splits
pack_results
kinds=attention_o_proj best_talker=${MS[A]}
for k in C:qk_norm_rope D:paged_decode E:combine_splits; do
  if lt ${MS[${k%%:*}]} $best_talker; then best_talker=${MS[${k%%:*}]} kinds=attention_o_proj,${k#*:}; fi
done
proj=0; lt ${MS[B]} ${MS[A]} && proj=1
try F VOXFLOW_PDL_EXIT=$kinds VOXFLOW_PROJECTED_TABLES=$proj
echo "bench: VOXFLOW_PDL_EXIT=$kinds VOXFLOW_PROJECTED_TABLES=$proj" | tee -a $R/choice.txt
pack_results
(export VOXFLOW_PDL_EXIT=$kinds VOXFLOW_PROJECTED_TABLES=$proj; bench_1p7b_at 1 exit_${kinds//,/_}_proj$proj)
echo "done at ${SECONDS}s"
