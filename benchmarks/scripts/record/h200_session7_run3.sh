#!/usr/bin/env bash
# Prepared in session 6: where a step goes at the best-concurrency level (c=256 gave 688.9 audio-s/s offline in
# session 6, target >= 1,000): the engine step at 64 and 256 streams (graph replays, kernels, host phases; eager
# stage split at 64), then the codec alone at 128 streams (the largest codec call at c=256) in TF32 and bf16.
set -uo pipefail
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
timeout 330 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 2>&1 | grep -v Warning > $R/profile_step_64_256.txt
grep -E "per step|kernels per step" $R/profile_step_64_256.txt
timeout 150 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 128 fp32,bf16 2>&1 | grep -v Warning > $R/profile_codec_128.txt
grep "B=128" $R/profile_codec_128.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
