#!/usr/bin/env bash
# Prepared in session 55, run in session 56. ~660 s (UNTIL cuts the first part);
# carry [".whl", ".device_tree"]. In the order that keeps the most if cut:
# 1. 0.6B c=64 over HTTP, alternating: the defaults against chunk_ramp_factor=2 + codec_tail_chunk=10 (8 chunks a
#    request: 5, 10, 25 x 5, 10), d_0 f2_1 d_1 f2_2 (UNTIL, default 330 s, stops the loop);
# 2. the codec call alone (ab_codec_call.py: random real-size weights, fp16, 16 streams on 64 SMs, 1 / 5 / 25 frames),
#    two rounds: the defaults, TMA tiles across sequences (VOXFLOW_CONV_TMA_FLAT), and with them the first
#    convolution channels-last (VOXFLOW_CODEC_FIRST_CONV_CL): session 55 timed them only together with the
#    one-channel kernel (now the default), which accounted for about all of their -0.17 ms a 25-frame call; then
#    the fused residual units with K blocks wider than the channels' split (96 channels: 64 or 128, not 32);
# 3. their GPU tests (the flat test's stack part now runs several streams: not yet run on a GPU); 4. the Base GPU
#    test that failed on imports in session 54.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in f2_1 d_1 f2_2; do
  (( SECONDS < ${UNTIL:-330} )) || break
  if [[ $run == f2_* ]]; then
    http_small $run --engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
summarize_steps "steps_http_*.jsonl*" 20
grep -h "turnover" "$R/step_summaries.txt"
report_runs
grep -H "ran dry" "$R"/*.md
pack_results
# the fused residual units in K blocks past the channels (TMA zero-fills them; added in session 56): 96 channels in
# blocks of 64 (2 a tap) or 128 (1), 192 in blocks of 128 (2), against the defaults (96: 32, 3 a tap; 192: 64)
F=kernels.causal_conv.CONV_TMA_FLAT=True
U=kernels.residual_unit_tma.CONFIGS
T96="'BLOCK_T': 128, 'BLOCK_N': 64, 'BLOCK_N2': 32, 'num_warps': 4"
timeout 200 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "flat:$F" \
  "first:$F,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True" \
  "k64:$U[96]={$T96, 'BLOCK_K': 64, 'num_stages': 4}" "k128:$U[96]={$T96, 'BLOCK_K': 128, 'num_stages': 3}" \
  "k192:$U[192]={'BLOCK_T': 64, 'BLOCK_N': 128, 'BLOCK_N2': 64, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 2}" \
  > "$R/ab_codec_call.txt" 2>&1
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
gpu_tests 80 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py -k "one_channel or flat or fused_tma_residual"
pack_results
python3 -c "import transformers, tokenizers, huggingface_hub as h
print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hub', h.__version__)" \
  | tee "$R/versions.txt"
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_no_host_sync.py > "$R/gpu_tests_base.txt" 2>&1
tail -2 "$R/gpu_tests_base.txt"
pack_results
echo "done at ${SECONDS}s"
