#!/usr/bin/env bash
# Session 49, call 1 (prepared in session 48); carry [".whl", ".device_tree"]. ~450 s.
# The fused fp16 residual unit (voxflow/kernels/residual_unit_tma.py, VOXFLOW_FUSED_RESIDUAL_UNIT_TMA, off): the
# 96- / 192-channel units' k=7 and 1x1 convolutions in one kernel, h kept on the SM. Built and tested on the CPU
# (interpreter; compiles for sm_90 with 98 / 191 registers, no spill); never run on a GPU yet. First its GPU test,
# then the unit's time against the two kernels (whole GPU, 16 x 25-frame shapes), the codec call's (64 SMs), and,
# if those win, the served A/B offline (0.6B c=64 <= 8 GB, alternating). Adopt only with the SNR test passing and
# the served runs faster; else into docs/gpu_path.md's not-kept table.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 200 tests/gpu/test_gpu_codec.py -k "fused_tma or split_n"
timeout 150 python3 benchmarks/scripts/probe_residual_unit_tma.py --sweep 2>&1 | grep -v -i warn | tee $R/probe_residual_unit_tma.txt
pack_results
wait $CK6
CODEC_MODEL=/tmp/real-0.6b profile_codec_16 two_kernels VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
CODEC_MODEL=/tmp/real-0.6b profile_codec_16 fused VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
pack_results
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_small_first off_0                                              # (compiles the kernels)
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_small_traced on_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_small_traced off_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_small_traced on_2
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
