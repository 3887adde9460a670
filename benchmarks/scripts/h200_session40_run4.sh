#!/usr/bin/env bash
# Session 40 call 4; carry [".whl", ".device_tree"]. ~300 s (the session's last device time).
# dense_decode_norm_rope.IN_REGISTERS (VOXFLOW_CP_ATTEND_IN_REGISTERS, default on, new): the code predictor's
# attention kernel keeps the normed query and the new key / value in registers instead of storing them, passing a
# barrier and loading them back: at 64 rows a one-warp program whose 7.0 us (session 36's H200 timeline, 80 launches
# a 0.6B step) is a chain of dependent memory round trips. GPU tests (both forms against qk_norm_rope + fp32
# attention, lengths 0-16, 1 / 64 / 256 rows), then 1.7B c=1 on / off (the thin RTF target: 75 launches a frame at
# 4 warps), then 0.6B c=64 on / off twice.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 100 tests/gpu/test_gpu_dense_attention.py -k norm_rope_append
pack_results
wait $CK
bench_1p7b_at 1 registers
(export VOXFLOW_CP_ATTEND_IN_REGISTERS=0; bench_1p7b_at 1 barrier)
pack_results
wait $CK6
for i in 1 2; do
  bench_small_traced registers_$i
  (export VOXFLOW_CP_ATTEND_IN_REGISTERS=0; bench_small_traced barrier_$i)
  summarize_steps "steps_0p6b_*.jsonl" 16
  pack_results
done
echo "done at ${SECONDS}s"
