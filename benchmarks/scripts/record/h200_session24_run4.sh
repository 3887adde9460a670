#!/usr/bin/env bash
# Session 24 call 4 (ran on tree 2451c74 in 134 s).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 500 s.
# 1. The green-context keep-alive (sm_partition._LIVE_CONTEXTS): the GPU tests of the codec on a partition,
#    and a teardown test in a subprocess (as run here it freed its frames before the runner, so it did not run call
#    3's failing order; since corrected). The tune's codec calls are call 3's failing code.
# 2. Call 3 again: the codec's fp16 convolution tiles re-tuned on 64 of the 132 SMs (where the served codec runs;
#    the TUNED table was chosen on the whole GPU), 16 streams x 25 frames. Compare the BEST lines with the table.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
gpu_tests 150 tests/gpu/test_gpu_codec.py -k "partition or partitioned"
timeout 380 python3 benchmarks/scripts/tune_causal_conv.py 16 25 float16 64 > $R/tune_causal_conv_fp16_sms64.txt 2>&1
grep -E "^(BEST|NONE|codec|on )" $R/tune_causal_conv_fp16_sms64.txt
echo "done at ${SECONDS}s"
