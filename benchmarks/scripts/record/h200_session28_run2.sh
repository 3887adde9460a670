#!/usr/bin/env bash
# Session 28 call 2; carry [".whl", ".device_tree"].
# 1. 1.7B c=1: off / the weight preload on the talker's one-row GEMMs only (VOXFLOW_PDL_PRELOAD=1
#    VOXFLOW_PDL_PRELOAD_MIN_WIDTH=2048; call 1: the talker's layer step 41.2 -> 39.1 us, the code predictor's frame
#    slower), bench and step profile each;
# 2. the codec alone, fp16 on the served 64-SM partition, 16 streams, chunks of 1, 5, 10 and 25 frames, the top 45
#    kernels: where its time goes now (its last per-kernel breakdown in fp16 predates TMA and the partition).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
bench_1p7b_at 1 off
VOXFLOW_PDL_PRELOAD=1 VOXFLOW_PDL_PRELOAD_MIN_WIDTH=2048 bench_1p7b_at 1 preload_talker
pack_results
for v in off preload_talker; do
  case $v in off) e=(VOXFLOW_PDL_PRELOAD=0) ;; *) e=(VOXFLOW_PDL_PRELOAD=1 VOXFLOW_PDL_PRELOAD_MIN_WIDTH=2048) ;; esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
    | grep -v Warn > $R/profile_step_1p7b_1_$v.txt
  head -12 $R/profile_step_1p7b_1_$v.txt
done
pack_results
timeout 200 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16+sms64 1,5,10,25 45 2>&1 \
  | grep -v -i warn > $R/profile_codec_16_fp16_sms64.txt
grep -E "per call|graph capture" $R/profile_codec_16_fp16_sms64.txt
echo "done at ${SECONDS}s"
