#!/usr/bin/env bash
# Session 30, call 5. Carry [".whl", ".device_tree"].
# The new defaults (call 4's F: attention_o_proj on the exit trigger, the projected input tables on; benched there,
# RTF 0.041, 24.45 audio-s/s): their GPU tests (PDL on / off bit-equal with every kind on the exit trigger too; the
# fused layers; the engine's fp32 codes against the CPU reference; the draws' two row copies); then one more A/B:
# the weight preload at the code predictor's widths (VOXFLOW_PDL_PRELOAD_MIN_WIDTH=1024; session 28 refuted it when
# the placement effect was still there), the probe and the c=1 step timeline, against the defaults' timeline.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 280 tests/gpu/test_gpu_pdl.py tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_select_tokens.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
echo "  at ${SECONDS}s"
pack_results
for w in 2048 1024; do
  echo "== VOXFLOW_PDL_PRELOAD_MIN_WIDTH=$w" | tee -a $R/probe_cp_step_chain.txt
  VOXFLOW_PDL_PRELOAD_MIN_WIDTH=$w timeout 100 python3 benchmarks/scripts/probe_cp_step_chain.py 2>&1 \
    | grep -v -i warn | grep -v "^NVIDIA" | tee -a $R/probe_cp_step_chain.txt
done
pack_results
wait $CK
timeline_at /tmp/real-1.7b 1 1p7b_c1_defaults
timeline_at /tmp/real-1.7b 1 1p7b_c1_preload1024 VOXFLOW_PDL_PRELOAD_MIN_WIDTH=1024
echo "done at ${SECONDS}s"
