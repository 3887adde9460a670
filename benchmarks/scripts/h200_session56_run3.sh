#!/usr/bin/env bash
# Session 56, one call in place of run1 + run2 when the device budget left is under ~750 s (refused starts ate the
# rest). ~600 s; carry [".whl", ".device_tree"]. In the order that keeps the most if cut:
# 1. 0.6B c=64 over HTTP, alternating: the defaults against chunk_ramp_factor=2 + codec_tail_chunk=10 (8 chunks a
#    request: 5, 10, 25 x 5, 10), d_0 f2_1 d_1 [f2_2] (UNTIL, default 300 s, stops the loop);
# 2. the codec call alone (ab_codec_call.py: random real-size weights, fp16, 16 streams on 64 SMs, 1 / 5 / 25
#    frames), two rounds: the defaults; the first convolution channels-last with flat TMA tiles (FIRST_CONV_CL +
#    CONV_TMA_FLAT); the upsample stages over rows (UPSAMPLE_CL), alone and with those two; the 96-channel fused
#    residual units in K blocks of 64 / 128 (TMA zero-fills past the 96 channels; the default 32);
# 3. the GPU tests of those switches.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in f2_1 d_1 f2_2; do
  (( SECONDS < ${UNTIL:-300} )) || break
  if [[ $run == f2_* ]]; then
    http_small $run --engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
summarize_steps "steps_http_*.jsonl*" 20
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
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
