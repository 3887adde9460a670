#!/usr/bin/env bash
# Session 57 call 2, as it ran inline on the warm H100 (43 s; the variants of the retired h200_next_short.sh, cut to
# fit the ~270 s of device time left): the codec call alone, base / the upsample stages over rows / with the first
# convolution channels-last and flat TMA tiles / the 96-channel fused units in K blocks of 64. Carry [".whl",
# ".device_tree"].
source benchmarks/scripts/device_lib.sh; device_setup /tmp/r >/dev/null 2>&1
F=kernels.causal_conv.CONV_TMA_FLAT=True,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True
ROWS=models.qwen3_tts.codec_upsample_cl.ENABLED=True; U=kernels.residual_unit_tma.CONFIGS
T96="'BLOCK_T': 128, 'BLOCK_N': 64, 'BLOCK_N2': 32, 'num_warps': 4"
(while sleep 15; do pack_results; done) &
timeout 210 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "rows:$ROWS" "rows_first:$F,$ROWS" \
  "k64:$U[96]={$T96, 'BLOCK_K': 64, 'num_stages': 4}" > $R/ab_codec_call.txt 2>&1
grep -E "codec|Error" $R/ab_codec_call.txt; pack_results
