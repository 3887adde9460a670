#!/usr/bin/env bash
# Prepared in session 26 (NOT YET RUN; rename it to the session's run name once it has run, and keep it as that
# call's record). `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 450 s.
# The codec's convolutions with their operand tiles through TMA descriptors (causal_conv._conv_cl_tma_kernel, off by
# default until this has run: VOXFLOW_CONV_TMA=1), the lever named for the 0.6B c=64 target (800 audio-s/s; 666-686
# in session 26, the convolutions at ~290 TFLOP/s fp16 with pointer loads):
# 1. GPU tests: the TMA kernel against the pointer kernel at the codec's shapes, the fp16 stack's streamed SNR with
#    it on, and the rest of the codec file;
# 2. the TMA kernel's tiles tuned at the served call size (tune_causal_conv.py 16 25 float16);
# 3. 0.6B c=64 in the <= 8 GB configuration off / on, with step traces, and the staggered profile with it on. Turn
#    it on by default if the tests pass and the served rate rises beyond session 26's spread (666-686).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_codec.py
pack_results
# (the tiles re-tuned for the TMA kernel at the served call, 16 streams x 25 frames: its BEST lines against the
# pointer kernel's session-15 table, and the whole codec call with the current table and with the winners)
VOXFLOW_CONV_TMA=0 timeout 60 python3 -c "import sys; sys.argv = ['t', '16', '25', 'float16']; \
sys.path.insert(0, 'benchmarks/scripts'); import torch, tune_causal_conv as t; t.codec_call(torch.float16)" \
  > $R/codec_call_pointer.txt 2>&1
grep -E "codec" $R/codec_call_pointer.txt | tail -3
VOXFLOW_CONV_TMA=1 timeout 150 python3 benchmarks/scripts/tune_causal_conv.py 16 25 float16 > $R/tune_conv_tma.txt 2>&1
grep -E "BEST|codec|with" $R/tune_conv_tma.txt | tail -20
pack_results
wait $CK6
bench_small_traced tma_off
VOXFLOW_CONV_TMA=1 bench_small_traced tma_on
pack_results
VOXFLOW_CONV_TMA=1 timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 --no-eager --stagger \
  codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v Warn > $R/profile_step_0p6b_64_tma.txt
head -20 $R/profile_step_0p6b_64_tma.txt
echo "done at ${SECONDS}s"
