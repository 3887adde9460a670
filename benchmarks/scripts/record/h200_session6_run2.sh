#!/usr/bin/env bash
# Session 6, device run 2: the channels-last codec stack. GPU tests (all), then the codec alone at 64 streams
# (channels-last fp32/TF32 and bf16 against the [B, C, T] path), and its SNR against plain fp32 (TF32, bf16).
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1
STAGE=none bash $S > /dev/null 2>&1   # installs the carried wheels into /tmp/site (librosa for the voice-clone test)
export PYTHONPATH=$PWD:/tmp/site
(python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1) &
ck=$!
timeout 200 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests.txt 2>&1
tail -2 $R/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head -20
wait $ck
timeout 150 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 64 fp32,fp32+ncl,bf16 2>&1 | grep -v Warning \
  > $R/profile_codec.txt; grep "B=64" $R/profile_codec.txt
for a in "--dtype float32 --tf32" "--dtype bfloat16"; do
  timeout 60 python3 -m voxflow.tools.codec_snr --model /tmp/real-1.7b --device cuda --frames 150 $a 2>&1 | tail -2 | head -1
done | tee $R/codec_snr.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
