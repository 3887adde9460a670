#!/usr/bin/env bash
# Session 24 call 4. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 500 s.
# 1. The green-context keep-alive (sm_partition._LIVE_CONTEXTS): the GPU tests of the codec on a partition,
#    including the teardown that aborted call 3 (a partitioned runner collected before its states), in a subprocess.
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
