#!/usr/bin/env bash
# Prepared in session 56 (not run: every start refused), for right after h200_next_run1.sh (its machine warm);
# rename when run. ~290 s; carry [".whl", ".device_tree"].
# 1. The codec call alone (ab_codec_call.py: random real-size weights, fp16, 16 streams on 64 SMs, 1 / 5 / 25
#    frames), two rounds: the defaults; TMA tiles across sequences (VOXFLOW_CONV_TMA_FLAT); with them the first
#    convolution channels-last (VOXFLOW_CODEC_FIRST_CONV_CL) - session 55 timed both only together with the
#    one-channel kernel (now the default), which accounted for about all of their -0.17 ms a 25-frame call; the
#    fused residual units in K blocks wider than the channels' split (TMA zero-fills past C: 96 channels in blocks
#    of 64 or 128, not 32; 192 in 128, not 64); the upsample stages over rows (VOXFLOW_CODEC_UPSAMPLE_CL), alone
#    and handing their rows to the first convolution channels-last (with flat tiles).
# 2. The Base GPU test that failed on imports in session 54.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
F=kernels.causal_conv.CONV_TMA_FLAT=True
U=kernels.residual_unit_tma.CONFIGS
ROWS=models.qwen3_tts.codec_upsample_cl.ENABLED=True
T96="'BLOCK_T': 128, 'BLOCK_N': 64, 'BLOCK_N2': 32, 'num_warps': 4"
timeout 280 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "flat:$F" \
  "first:$F,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True" \
  "k64:$U[96]={$T96, 'BLOCK_K': 64, 'num_stages': 4}" "k128:$U[96]={$T96, 'BLOCK_K': 128, 'num_stages': 3}" \
  "k192:$U[192]={'BLOCK_T': 64, 'BLOCK_N': 128, 'BLOCK_N2': 64, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 2}" \
  "rows:$ROWS" \
  "rows_first:$F,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True,$ROWS" \
  > "$R/ab_codec_call.txt" 2>&1
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
python3 -c "import transformers, tokenizers, huggingface_hub as h
print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hub', h.__version__)" \
  | tee "$R/versions.txt"
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_no_host_sync.py > "$R/gpu_tests_base.txt" 2>&1
tail -2 "$R/gpu_tests_base.txt"
pack_results
echo "done at ${SECONDS}s"
