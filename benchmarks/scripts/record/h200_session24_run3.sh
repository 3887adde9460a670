#!/usr/bin/env bash
# Session 24 call 3 (prepared in session 23; ran on tree f71c7f3 in 30 s). It aborted after the first codec timing:
# "CUDA error: context is destroyed" (the frames the runner had read, marked with record_stream for its stream,
# freed after its green context; fixed by sm_partition._LIVE_CONTEXTS).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 400 s.
# The codec's convolution tiles re-tuned where the served codec runs: on 64 of the H200's 132 SMs (codec_sms "auto",
# the default since session 22), for the 0.6B configuration's calls of 16 streams x 25 frames in fp16. The TUNED
# table was chosen on the whole GPU (session 15 call 3); a tile grid that fills 132 SMs in whole waves may leave a
# ragged last wave on 64. The codec holds its SMs for much of a c=64 run, and the talker's steps are slower while
# it does (session 23 call 4), so a faster codec call on 64 SMs is throughput. Compare the BEST lines with the table.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
timeout 420 python3 benchmarks/scripts/tune_causal_conv.py 16 25 float16 64 > $R/tune_causal_conv_fp16_sms64.txt 2>&1
grep -E "^(BEST|NONE|codec|on )" $R/tune_causal_conv_fp16_sms64.txt
echo "done at ${SECONDS}s"
