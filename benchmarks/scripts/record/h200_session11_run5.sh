#!/usr/bin/env bash
# Session 11, call 5 (carry [".whl"]; ~415 s of device time left): the codec's convolutions on a capped grid
# (causal_conv.MAX_PROGRAMS, VOXFLOW_CODEC_CONV_PROGRAMS) with the talker on a highest-priority stream, so the
# talker's latency-bound step keeps SMs while the codec decodes beside it (c=64: 6.5 ms talker + 2.57 ms codec added
# up to a 9.06 ms step). Baseline: call 4's default c=64 (467.7 audio-s/s; calls 1-2: 477.7, 453.5).
#  1. on the GPU: capped == uncapped convolution, bit for bit, at the real decoder's widest shape;
#  2. HTTP c=64 (256 prompts) with 66 and with 100 conv programs (132 SMs), talker_high_priority on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
timeout 60 python3 -c "
import torch, voxflow.kernels.causal_conv as cc
g = torch.Generator(device='cuda').manual_seed(0)
x = torch.randn(64, 300 + 18, 768, device='cuda', generator=g)
w = cc.pack_weight(torch.randn(768, 768, 7, device='cuda', generator=g) / 73.0)
b = torch.randn(768, device='cuda', generator=g)
terms = (torch.rand(768, device='cuda', generator=g) + 0.5, torch.rand(768, device='cuda', generator=g) + 0.5)
want = cc.conv1d_channels_last(x, w, b, 3, snake_terms=terms)
for cap in (66, 100):
    cc.MAX_PROGRAMS = cap
    got = cc.conv1d_channels_last(x, w, b, 3, snake_terms=terms)
    print('capped', cap, 'equal bit for bit:', torch.equal(got, want))
" 2>&1 | grep -v Warn | tee $R/capped_conv_check.txt
wait $CK
for cap in 66 100; do
  [ $SECONDS -gt 300 ] && { echo "skip $cap at ${SECONDS}s"; continue; }
  export VOXFLOW_CODEC_CONV_PROGRAMS=$cap
  if serve_variant cap$cap --engine-arg talker_high_priority=true; then
    bench_http --label http-cap$cap --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_cap$cap.json
  fi
  stop_server cap$cap
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
