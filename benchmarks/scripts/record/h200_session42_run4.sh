#!/usr/bin/env bash
# Session 42 call 4; carry [".whl", ".device_tree"]. ~450 s.
# qwen3_layer.GATE_UP_SILU (VOXFLOW_GATE_UP_SILU, off until measured): in a folded layer step above the skinny sizes
# (the code predictor's 75 and the 0.6B talker's 28 layer steps a c=64 frame) gate|up, its row factor and silu * up
# in one Triton kernel (voxflow/kernels/gate_up_silu.py) instead of cuBLAS's GEMM and silu_mul_folded (2.9 us and a
# launch gap a layer step, session 41). 1. GPU tests: the kernel against cuBLAS + silu_mul_folded at the real shapes,
# in a graph, other tiles; predict on / off at 64 rows. 2. tune_gate_up_silu.py: the two launches against the kernel's
# tiles at 64 rows x K 1024 x I 3072, bf16; the fastest tiles go to the served A/B. 3. 0.6B c=64 offline (<= 8 GB
# configuration, 2.4 GB pool, step traces) off / on / off / on; then 1.7B c=64 off / on if time is left. Adopt on the
# full steps' medians and the audio-s/s of both pairs.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B 1.7B
gpu_tests 150 tests/gpu/test_gpu_gate_up_silu.py tests/gpu/test_gpu_cp_layer.py -k "gate_up_silu or folded_norms"
echo "  at ${SECONDS}s"
timeout 150 python3 benchmarks/scripts/tune_gate_up_silu.py 64 1024 3072 --budget 90 2>&1 | grep -v -i warn \
  > $R/tune_gate_up_silu.txt
cat $R/tune_gate_up_silu.txt | tail -4
TILES=$(tail -1 $R/tune_gate_up_silu.txt)
[[ $TILES =~ ^[0-9]+,[0-9]+,[0-9]+,[0-9]+$ ]] || TILES=32,128,4,4
echo "  tiles $TILES at ${SECONDS}s"
pack_results
wait $CK6
for i in 1 2; do
  bench_small_traced off_$i
  (export VOXFLOW_GATE_UP_SILU=1 VOXFLOW_GATE_UP_SILU_TILES=$TILES; bench_small_traced on_$i)
  grep -h "^| c=" $R/h200_0p6b_offline_c64_off_$i.md $R/h200_0p6b_offline_c64_on_$i.md
  summarize_steps "steps_0p6b_*.jsonl" 8
  pack_results
done
wait $CK
bench_1p7b_c64 off
(export VOXFLOW_GATE_UP_SILU=1 VOXFLOW_GATE_UP_SILU_TILES=$TILES; bench_1p7b_c64 on)
summarize_steps "steps_*.jsonl" 8
echo "done at ${SECONDS}s"
