#!/usr/bin/env bash
# Prepared in session 16 for the next session's first call (`bash benchmarks/scripts/stamp_tree.sh` first; carry
# [".whl", ".device_tree"]): where a step's time goes with today's defaults (the fp16 codec since session 15), the
# profile session 16's calls lost to their time limits (the first profile_step of a call pays Triton's JIT for
# every kernel: give it >= 150 s).
#  1. profile_step 1.7B c=1 / 64 / 256 with the defaults, and c=64 / 256 with the codec in fp32 (its share);
#  2. profile_step 0.6B c=64 in the <= 8 GB configuration (2 GB KV pool, codec calls of <= 16 requests).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
wait $CK
timeout 220 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64,256 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64_256_default.txt
grep -E "ms per step" $R/profile_step_1_64_256_default.txt
timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager codec_dtype=float32 2>&1 \
  | grep -v Warn > $R/profile_step_64_256_fp32codec.txt
grep -E "ms per step" $R/profile_step_64_256_fp32codec.txt
wait $CK6
if [ $SECONDS -lt 450 ]; then      # the command limit is 600 s
  timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 --no-eager codec_max_batch=16 \
    kv_cache_bytes=2000000000 2>&1 | grep -v Warn > $R/profile_step_0p6b_64_8gb.txt
  grep -E "ms per step" $R/profile_step_0p6b_64_8gb.txt
fi
echo "done at ${SECONDS}s"
