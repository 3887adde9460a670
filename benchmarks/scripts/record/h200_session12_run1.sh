#!/usr/bin/env bash
# Prepared in session 11 (its device time spent) for the next session's first call, carry [".whl"]:
#  1. GPU tests: the paged decode kernel with the q/k norms + RoPE inside (== qk_norm_rope then the kernel), the
#     engine with layers.paged_attention.PAGED_NORM_ROPE on == the CPU reference;
#  2. bench_select_tokens: warps 2 / 4 / 8 / 16 at 2 radix bits a pass (the draw is ~10 us at V = 2048, ~16 at
#     3072; 16 draws a frame);
#  3. profile_step c=1,64 default vs VOXFLOW_PAGED_NORM_ROPE=1 (28 qk_norm_rope launches a step fewer);
#  4. HTTP c=1 (8 prompts) and c=64 (256) default vs VOXFLOW_PAGED_NORM_ROPE=1;
#  5. (time permitting) profile_step c=64 with the eager stage split (talker / code predictor / samplings).
# Decide: PAGED_NORM_ROPE on by default if the steps get faster; select_tokens' num_warps from the bench.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_paged_norm_rope_equals_cpu_reference"
timeout 60 python3 benchmarks/scripts/bench_select_tokens.py > $R/bench_select_tokens.txt 2>&1; cat $R/bench_select_tokens.txt
wait $CK
for v in default pnr; do
  [ $v = pnr ] && export VOXFLOW_PAGED_NORM_ROPE=1
  timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_1_64_$v.txt
  echo "$v:"; grep -E "ms per step" $R/profile_step_1_64_$v.txt
  unset VOXFLOW_PAGED_NORM_ROPE
done
for v in default pnr; do
  [ $v = pnr ] && export VOXFLOW_PAGED_NORM_ROPE=1
  if serve_variant $v; then
    bench_http --label http-$v --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_$v.json
    bench_http --label http-$v --concurrency 64 --num-prompts 256 --num-warmups 8 --output $R/h200_1p7b_http_c64_$v.json
  fi
  stop_server $v
  unset VOXFLOW_PAGED_NORM_ROPE
done
if [ $SECONDS -lt 480 ]; then
  timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 2>&1 | grep -v Warn > $R/profile_step_64_eager.txt
  grep -A8 "eager" $R/profile_step_64_eager.txt | head -12
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
