#!/usr/bin/env bash
# Session 9, call 5 (carry [".whl"]): did the codec's linears leave the fp32 FMA GEMMs? The c=256 step profile
# again (call 3 had 1.8 ms of sm80 f32 FFMA GEMMs a step and a 13.37 ms codec stream).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 256 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_256.txt
grep -E "per step|ffma|f32f32|tf32" $R/profile_step_256.txt | head -12
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
