#!/usr/bin/env bash
# Session 14, call 5 (carry [".whl"]), tree 26415d6 with the persistent convolution reverted (the session's final
# kernels):
#  1. the GPU codec tests call 4's time limit cut (async == sync decode, warm-up shapes, the fused kernels == the
#     plain torch decoder, the bf16 channels-last stack), with the pool's states packed;
#  2. an A/B on one machine of the packed codec state pool: offline c=256 (512 prompts) with it, then with the
#     pool as it was (6ed02f7's codec_pool.py, copied in as benchmarks/scripts/ab_codec_pool_before.py) - call 4's
#     746.8 audio-s/s against call 1's 788.3 on another machine left open whether the pool or the machine moved.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 130 tests/gpu/test_gpu_codec.py -k "async or warmup or fused or channels_last"
echo "tests done at ${SECONDS}s"
wait $CK
offline() {
  timeout 110 python3 -m voxflow.bench --model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 \
    --ignore-eos --no-progress --no-plots --label "offline-$1" --concurrency 256 --num-prompts 512 --num-warmups 8 \
    --max-num-seqs 256 --output "$R/h200_1p7b_offline_c256_$1.json" 2>&1 | grep -v "^\s*$" | tail -2
  grep -E "^\| c=|breakdown" "$R/h200_1p7b_offline_c256_$1.md"
}
offline packed
cp benchmarks/scripts/ab_codec_pool_before.py voxflow/models/qwen3_tts/codec_pool.py
[ $SECONDS -lt 440 ] && offline before
echo "done at ${SECONDS}s"
