#!/usr/bin/env bash
# Session 11, call 3 (carry [".whl"]): call 2's one-row heuristics made the c=1 step slower in a real graph (4.14 ms;
# the isolated-kernel tunes said faster). ab_one_row_configs.py times each heuristic change alone (CP predict with
# the fused layers off / on, the talker's one-row layer step), then profile_step c=1 runs under the session-10
# heuristics ("old") and under the best variant; the top-k radix select now 2 bits a pass (call 2's bench).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 60 tests/gpu/test_gpu_select_tokens.py
AB_BEST=$R/ab_best.txt timeout 200 python3 benchmarks/scripts/ab_one_row_configs.py 2>&1 | grep -v Warn > $R/ab_one_row_configs.txt
cat $R/ab_one_row_configs.txt
wait $CK
read BEST FUSED < $R/ab_best.txt || { BEST=old; FUSED=1; }
for v in old $BEST; do
  [ $SECONDS -gt 480 ] && break
  VOXFLOW_CP_FUSED_LAYER=$([ $v = $BEST ] && echo $FUSED || echo 1) timeout 80 python3 \
    benchmarks/scripts/ab_one_row_configs.py --variant $v -- benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 \
    --no-eager 2>&1 | grep -v Warn > $R/profile_step_1_$v.txt
  echo "$v (fused $FUSED if best):"; grep -E "ms per step" $R/profile_step_1_$v.txt
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
