#!/usr/bin/env bash
# Prepared in session 39; carry [".whl", ".device_tree"]. Rename to h200_sessionNN_runK.sh when run. ~400 s.
# codec_pool.STATE_WRITER (VOXFLOW_CODEC_STATE_WRITER, on by default since session 39 without a GPU run): a codec
# step's decode writes its new state straight into the packed write-back rows (codec_decoder_blocks.StateWriter; the
# key / value window kernel stores its carried rows there itself) instead of into tensors of their own that a cat
# then packed: session 39 call 1's profile of a 16-stream 1-frame call (H100) had that cat as one 114 us kernel of
# 1.68 ms of kernel time (4.4% of a 5-frame call's, <1% at 25). Counted on a CPU (count_codec_launches.py) the call
# has 3 launches more (222 against 219: the cat gone, 4 copies of the other transposed-convolution form's entries,
# which the decode does not update, into the write-back rows). This call: the GPU tests (the same PCM bits through
# the graphs with and without it, kv_window into a packed buffer's pieces, the codec's graph path), the codec alone
# (16 streams, fp16, 64 SMs, 1 / 5 / 25 frames) with it on / off, then 0.6B c=64 (<= 8 GB) alternating on / off
# twice. Keep it if the codec's 1-frame call is faster; if its GPU test fails, VOXFLOW_CODEC_STATE_WRITER=0 and mend.
# Session 39 ran on an H100 that was lent for an H200: compare only within the call.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK
gpu_tests 200 tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_codec_small_kernels.py \
  -k "write_back_rows or kv_window or graph_path_equals or fp16_streaming or epilogues"
pack_results
profile() {                            # the codec alone under some settings: profile LABEL [ENV=VALUE...]
  local label=$1; shift
  env "$@" timeout 100 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16+sms64 1,5,25 25 2>&1 \
    | grep -v -i warn > $R/profile_codec_16_fp16_sms64_$label.txt
  echo "$label"; grep -E "per call" $R/profile_codec_16_fp16_sms64_$label.txt
}
profile writer
profile cat VOXFLOW_CODEC_STATE_WRITER=0
profile writer_again
profile cat_again VOXFLOW_CODEC_STATE_WRITER=0
pack_results
wait $CK6
for i in 1 2; do
  bench_small_traced writer_$i
  VOXFLOW_CODEC_STATE_WRITER=0 bench_small_traced cat_$i
done
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
echo "done at ${SECONDS}s"
