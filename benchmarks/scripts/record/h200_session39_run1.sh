#!/usr/bin/env bash
# Prepared in session 38 (its device starts were all refused); carry [".whl", ".device_tree"]. Rename to
# h200_sessionNN_runK.sh when run. ~480 s.
# codec_waveform_cl.ACT_IN_EPILOGUE (VOXFLOW_CODEC_ACT_EPILOGUE, 0 = off, the default until this call): the SnakeBeta
# that starts the next block (1), or every residual unit too (2), applied by the kernel before it (the 1x1
# convolution's epilogue; the transposed convolution's overlap-add or sub-pixel convolution), which writes it after
# the next layer's left context, instead of a SnakeBeta pass of its own (17 passes a codec call were 13% of a
# 16-stream 25-frame call's kernel time in session 28 call 2; 1 removes 4 of them, 2 removes 16, storing each unit's
# input twice). Registers (compile_check, sm_90, fp16): the TMA 1x1 kernel 93 -> 140 with the activation alone (one
# 8-warp block an SM instead of two), 108 with the second store; the pointer kernel under its 128 cap spills 80 B
# with the activation alone. This call: the codec GPU tests of the switch (fp32 against the plain decoder, fp16
# SNR); the codec alone (16 streams, fp16 on 64 SMs, 1 / 5 / 25 frames) at 0 / 1 / 2, and at 0 / 2 with the
# sub-pixel transposed convolutions, with per-kernel times; 0.6B c=64 (<= 8 GB) at 0 / 2 / 1 / 0 with step traces.
# Adopt the best level if it beats the spread (~±2%); if sub-pixel became the default in the codec-pool call, the
# served runs take it too. Also timed: the codec pool's row gather / scatter as Triton passes (kernels/row_copy.py,
# on by default since session 38 without a GPU measurement; session 28: torch's index_select 144 us + index_copy_
# 123 us a call) and the frame-rate part's new kernels (VOXFLOW_CODEC_FRAME_KERNELS: the dequantiser's lookups, 16
# index_select calls for 0.26 ms of a 1-frame call; the attention's key / value window, 32 cats and clones; the
# LayerScale'd adds with their norms) against torch's (both =0): keep the faster. Also new and on: the attention's
# RoPE through the rotary kernel and its q|k|v in one GEMM
# (session 28's 1-frame call: 440 kernels, 2.58 ms; counted on a CPU, 409 -> 235 launch-like operations a call:
# benchmarks/results/cpu/2026-12-05-codec-launches/). Run this call first: most of its code is new on a GPU.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK
gpu_tests 200 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py \
  -k "row_copies or rvq_lookup or kv_window or epilogues or fused_codec_kernels or fp16_streaming or graph_path"
pack_results
profile() {                            # the codec alone under some settings: profile LABEL [ENV=VALUE...]
  local label=$1; shift
  env "$@" timeout 100 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16+sms64 1,5,25 25 2>&1 \
    | grep -v -i warn > $R/profile_codec_16_fp16_sms64_$label.txt
  echo "$label"; grep -E "per call" $R/profile_codec_16_fp16_sms64_$label.txt
}
profile act0
profile act0_torch_small VOXFLOW_CODEC_ROW_COPY=0 VOXFLOW_CODEC_FRAME_KERNELS=0
profile act1 VOXFLOW_CODEC_ACT_EPILOGUE=1
profile act2 VOXFLOW_CODEC_ACT_EPILOGUE=2
profile sub_act0 VOXFLOW_CODEC_SUBPIXEL=1
profile sub_act2 VOXFLOW_CODEC_SUBPIXEL=1 VOXFLOW_CODEC_ACT_EPILOGUE=2
pack_results
wait $CK6
bench_small_traced act0
VOXFLOW_CODEC_ACT_EPILOGUE=2 bench_small_traced act2
VOXFLOW_CODEC_ACT_EPILOGUE=1 bench_small_traced act1
bench_small_traced act0_again
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
echo "done at ${SECONDS}s"
