#!/usr/bin/env bash
# Session 40 call 3; carry [".whl", ".device_tree"]. ~300 s.
# FOLDED_NORMS_PAGED (the talker's norms folded into its weights in place; its layer steps above the skinny sizes
# through the folded path): call 2 measured 0.6B c=64 709.7 / 708.0 (defaults) against 722.4 (on), full-step median
# 5.91 / 5.93 -> 5.81 ms, 1.7B c=64 631.8 / 631.5 with full steps 6.62 -> 6.53. One run each: this call repeats the
# 0.6B A/B twice, alternating, and measures 1.7B c=1 (the thin RTF target; its one-row steps take the skinny path,
# but the folded weights are what that path reads too) before adopting it as the default.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK6
for i in 1 2; do
  (export VOXFLOW_FOLDED_NORMS_PAGED=1; bench_small_traced folded_$i)
  bench_small_traced defaults_$i
done
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
wait $CK
bench_1p7b_at 1 defaults
(export VOXFLOW_FOLDED_NORMS_PAGED=1; bench_1p7b_at 1 folded)
pack_results
echo "done at ${SECONDS}s"
