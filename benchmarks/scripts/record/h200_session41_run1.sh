#!/usr/bin/env bash
# Prepared in session 40 (its device time ran out before it ran), run as session 41 call 1; carry [".whl",
# ".device_tree"]. ~380 s.
# dense_decode_norm_rope.IN_REGISTERS (VOXFLOW_CP_ATTEND_IN_REGISTERS, off until measured): the code predictor's
# attention kernel keeps the normed query and the new key / value in registers instead of storing them, passing a
# barrier and loading them back: at 64 rows a one-warp program whose 7.0 us (session 36's H200 timeline, 80 launches
# a 0.6B step) is a chain of dependent memory round trips. GPU tests (both forms against qk_norm_rope + fp32
# attention, lengths 0-16, 1 / 64 / 256 rows), then 0.6B c=64 on / off twice, then 1.7B c=64 on / off. (At one row
# the code predictor runs cp_layer.py's fused layers, not this kernel: c=1 is not affected.) Adopt (default "1") if
# the full steps' medians drop.
# And VOXFLOW_CP_FOLDED_HEAD (off until measured): the code predictor's final norm folded into its 15 heads, the draw
# kernel scaling each logits row (15 norm launches fewer a 0.6B c=64 step): its GPU test, then in the 0.6B loop.
# Also the GPU test of session 40's OWNED_INPUT (on by default, the same bits: the code predictor's first layer adds
# into its own input rows; 16 copy launches fewer a 0.6B c=64 step), which the defaults here include.
# The sm_90 compile check: 221 registers at one warp, 106 at four, no spills (the barrier form: 141 at one warp).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 150 tests/gpu/test_gpu_dense_attention.py tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_select_tokens.py \
  -k "norm_rope_append or owned or folded_head or row_scale"
pack_results
wait $CK6
for i in 1 2; do
  (export VOXFLOW_CP_ATTEND_IN_REGISTERS=1; bench_small_traced registers_$i)
  bench_small_traced barrier_$i
  (export VOXFLOW_CP_FOLDED_HEAD=1; bench_small_traced folded_head_$i)
  summarize_steps "steps_0p6b_*.jsonl" 16
  pack_results
done
wait $CK
(export VOXFLOW_CP_ATTEND_IN_REGISTERS=1; bench_1p7b_at 64 registers)
bench_1p7b_at 64 barrier
pack_results
echo "done at ${SECONDS}s"
