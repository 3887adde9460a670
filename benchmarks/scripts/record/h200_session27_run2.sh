#!/usr/bin/env bash
# Prepared in session 26; ran as session 27 call 2 (tree c03b450, 138 s).
# Carry [".whl", ".device_tree"].
# TMA convolutions are the default since 7efed93 (for fp16 tensors only since 16a16dc): on later trees the "off"
# runs below need VOXFLOW_CONV_TMA=0 set (`bench_small_traced tma_off` sets nothing and would run with TMA on).
# The codec's convolutions with their operand tiles through TMA descriptors (causal_conv._conv_cl_tma_kernel, off by
# default until this has run: VOXFLOW_CONV_TMA=1), the lever named for the 0.6B c=64 target (800 audio-s/s; 666-686
# in session 26, the convolutions at ~290 TFLOP/s fp16 with pointer loads):
# 1. the GPU test: the TMA kernel against the pointer kernel at the codec's shapes, and the fp16 stack's streamed SNR
#    with it on;
# 2. the whole codec call at the served size, off / on (tune_causal_conv.py's codec_call);
# 3. 0.6B c=64 in the <= 8 GB configuration off / on, with step traces, and the staggered profile with it on. Turn
#    it on by default if the tests pass and the served rate rises beyond session 26's spread (666-686).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
# (the TMA test alone: the rest of the codec file does not take the switch, and a fresh machine's Triton compiles
# once cut a whole-file run at 200 s)
gpu_tests 200 "tests/gpu/test_gpu_codec.py::test_tma_convolutions_equal_the_pointer_kernel_and_keep_the_fp16_snr"
pack_results
# The whole codec call (16 streams x 1 / 10 / 25 frames, fp16) with pointer loads, then with TMA, both at the
# pointer kernel's tuned tiles (tune_causal_conv.py's call; a TMA table of its own is the step after, if it wins)
for v in 0 1; do
  VOXFLOW_CONV_TMA=$v timeout 90 python3 -c "import sys; sys.argv = ['t', '16', '25', 'float16']; \
sys.path.insert(0, 'benchmarks/scripts'); import torch, tune_causal_conv as t; t.codec_call(torch.float16)" \
    > $R/codec_call_tma$v.txt 2>&1
  grep -E "codec" $R/codec_call_tma$v.txt | tail -3
done
pack_results
wait $CK6
bench_small_traced tma_off
VOXFLOW_CONV_TMA=1 bench_small_traced tma_on
pack_results
VOXFLOW_CONV_TMA=1 timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 --no-eager --stagger \
  codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v Warn > $R/profile_step_0p6b_64_tma.txt
head -20 $R/profile_step_0p6b_64_tma.txt
echo "done at ${SECONDS}s"
