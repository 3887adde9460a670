#!/usr/bin/env bash
# Session 30, call 3. Carry [".whl", ".device_tree"].
# Call 2: the slow code-predictor chains are a PDL placement effect (the exit trigger everywhere made every chain
# ~109-116 us a step, but the whole c=1 step slower, 3.287 -> 3.472 ms). Now per kernel kind (pdl.trigger_mode,
# VOXFLOW_PDL_EXIT: the listed kinds take the exit trigger where they do not preload weights):
# 1. the probe under each setting (the layers chain kernel by kernel);
# 2. the 1.7B c=1 step timeline under the two likeliest settings, then the bench of the faster one.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
for kinds in "" norm_linear attention_o_proj skinny_linear norm_linear,skinny_linear select_tokens \
             norm_linear,skinny_linear,attention_o_proj,select_tokens; do
  echo "== VOXFLOW_PDL_EXIT=$kinds" | tee -a $R/probe_cp_step_chain.txt
  VOXFLOW_PDL_EXIT=$kinds timeout 100 python3 benchmarks/scripts/probe_cp_step_chain.py --timeline layers 2>&1 \
    | grep -v -i warn | grep -v "^NVIDIA" | tee -a $R/probe_cp_step_chain.txt
done
echo "  at ${SECONDS}s"
pack_results
wait $CK
best= best_ms=99
for kinds in norm_linear norm_linear,skinny_linear; do
  label=1p7b_c1_exit_${kinds//,/_}
  timeline_at /tmp/real-1.7b 1 $label VOXFLOW_PDL_EXIT=$kinds
  ms=$(head -1 $R/timeline_$label.txt | sed -E 's/.*timed step ([0-9.]+) ms.*/\1/')
  if python3 -c "import sys; sys.exit(0 if $ms < $best_ms else 1)"; then best=$kinds best_ms=$ms; fi
done
echo "faster: VOXFLOW_PDL_EXIT=$best ($best_ms ms)" | tee $R/choice.txt
pack_results
(export VOXFLOW_PDL_EXIT=$best; bench_1p7b_at 1 exit_${best//,/_})
echo "done at ${SECONDS}s"
