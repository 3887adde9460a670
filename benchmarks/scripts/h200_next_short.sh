#!/usr/bin/env bash
# Prepared in session 56 (not run): h200_next_run2.sh's codec A/B cut down, and the GPU tests, for a device budget
# under ~400 s (the HTTP A/B of h200_next_run1.sh needs ~350 s of its own). ~260 s; carry [".whl", ".device_tree"].
# 1. The codec call alone (ab_codec_call.py: random real-size weights, fp16, 16 streams on 64 SMs, 1 / 5 / 25
#    frames), two rounds: the defaults; the first convolution channels-last with flat TMA tiles (FIRST_CONV_CL +
#    CONV_TMA_FLAT); the upsample stages over rows (UPSAMPLE_CL), alone and with those two; the 96-channel fused
#    residual units in K blocks of 64 / 128 (TMA zero-fills past the 96 channels; the default 32).
# 2. The GPU tests of those switches.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
F=kernels.causal_conv.CONV_TMA_FLAT=True,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True
U=kernels.residual_unit_tma.CONFIGS
ROWS=models.qwen3_tts.codec_upsample_cl.ENABLED=True
T96="'BLOCK_T': 128, 'BLOCK_N': 64, 'BLOCK_N2': 32, 'num_warps': 4"
( while sleep 15; do pack_results; done ) &                   # (a call cut mid-way keeps what was printed)
PACKER=$!
timeout 200 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "first:$F" "rows:$ROWS" \
  "rows_first:$F,$ROWS" "k64:$U[96]={$T96, 'BLOCK_K': 64, 'num_stages': 4}" \
  "k128:$U[96]={$T96, 'BLOCK_K': 128, 'num_stages': 3}" > "$R/ab_codec_call.txt" 2>&1
kill $PACKER
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
gpu_tests 100 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py \
  -k "one_channel or flat or fused_tma_residual or upsample_stages"
pack_results
echo "done at ${SECONDS}s"
