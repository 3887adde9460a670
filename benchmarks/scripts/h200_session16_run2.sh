#!/usr/bin/env bash
# Prepared in session 15 for the next session's second call (`bash benchmarks/scripts/stamp_tree.sh` here first;
# carry [".whl", ".device_tree"]): where a step's time goes now that the codec runs in fp16 by default - the
# profile the code-predictor work (issue 6's remaining targets: c=64 >= 600, c=1 RTF 0.04, 0.6B >= 800) starts from.
#  1. profile_step c=1 / 64 / 256 with the defaults (fp16 codec), and c=64 / 256 with the codec in fp32 for the
#     codec's share (session 14, fp32 codec: c=64 8.97 ms a step, 5.94 ms talker-stream kernels; c=256 19.73 ms);
#  2. profile_codec 16 streams in fp16 (session 15 call 3: 10.57 ms a call with bf16's configs, 9.94 tuned).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
wait $CK
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64,256 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64_256_fp16.txt
grep -E "ms per step" $R/profile_step_1_64_256_fp16.txt
timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager codec_dtype=float32 2>&1 \
  | grep -v Warn > $R/profile_step_64_256_fp32codec.txt
grep -E "ms per step" $R/profile_step_64_256_fp32codec.txt
timeout 70 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16 2>&1 | grep -v Warn \
  > $R/profile_codec_16_fp16.txt
grep -E "per call" $R/profile_codec_16_fp16.txt
echo "done at ${SECONDS}s"
