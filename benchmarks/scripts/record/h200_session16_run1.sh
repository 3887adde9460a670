#!/usr/bin/env bash
# Prepared in session 15 (its device time spent) for the next session's first call. First, here:
# `bash benchmarks/scripts/stamp_tree.sh`; then carry [".whl", ".whl-official", ".device_tree"] (the tree is ~23 MB
# since the results are kept gzipped, so both wheel folders fit the 64 MiB carry; the stamp names the tree's commit
# in the results):
#  1. the GPU tests session 15 changed after its last call or could not run: the codec's (the fp16 check's TF32
#     restore, now starting from the switches on), the engine's (NaN audio now ends a request with an error; the
#     fp32 engine tests pin the codec to fp32), and the no-hidden-sync test with the `base` checkpoint, which failed
#     in session 15's call 5 only at import (transformers from the image vs the carried huggingface_hub:
#     .whl-official brings a transformers that imports);
#  2. HTTP c=64 with the defaults on the final tree (session 15: 554.1 audio-s/s, p99 223 ms).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 300 tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py
echo "tests done at ${SECONDS}s"
wait $CK
if [ $SECONDS -lt 430 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "done at ${SECONDS}s"
