#!/usr/bin/env bash
# Prepared in session 39; carry [".whl", ".device_tree"]. Rename to h200_sessionNN_runK.sh when run. ~500 s
# (session 39's call 1: start-up ~60 s, 15 GPU tests 114 s, a codec profile ~20 s, a 0.6B c=64 bench ~25 s).
# Three codec changes of session 39, on by default without a GPU run (and the RoPE table, below):
# - codec_pool.STATE_WRITER (VOXFLOW_CODEC_STATE_WRITER): a codec step's decode writes its new state straight into
#   the packed write-back rows (codec_decoder_blocks.StateWriter; the key / value window kernel stores its carried
#   rows there itself) instead of into tensors of its own that a cat then packed: session 39 call 1's profile of a
#   16-stream 1-frame call (H100) had that cat as one 114 us kernel of 1.68 ms of kernel time.
# - codec_decoder.WINDOW_ATTENTION (VOXFLOW_CODEC_WINDOW_ATTENTION): the streamed attention as one Triton kernel a
#   layer (kernels/window_attention.py: the carried window and the new rows read where they lie, the mask from the
#   positions, the output in o_proj's layout; fp16 199 registers, no spills) instead of the window's concatenation,
#   a boolean mask, cuDNN's attention (8 x 11.5 us in that call) and a transpose copy.
# - codec_waveform_cl.CONTEXT_KERNEL (VOXFLOW_CODEC_CONTEXT_KERNEL): each streamed convolution's carried context
#   into its input buffer and the next one out in one launch (kernels/context_exchange.py) instead of two copies.
# Also new and on (under VOXFLOW_CODEC_FRAME_KERNELS, not switched apart here): the RoPE tables and the streams'
# next positions in one launch (kernels/rope_table.py) instead of ~12.
# Counted on a CPU (count_codec_launches.py 16 1, the defaults): 219 launches a 1-frame call before these three,
# 196 with them, 179 with the context kernel too (benchmarks/results/cpu/2026-12-05-session39-codec-launches/).
# This call: the GPU tests (the same PCM bits through the graphs with and without the writer, kv_window into a
# packed buffer's pieces, the window attention against PyTorch's at the codec's shapes, the codec's graph path and
# fp16 SNR), the codec alone (16 streams, fp16, 64 SMs, 1 / 5 / 25 frames) with all three, each off, none, then
# 0.6B c=64 (<= 8 GB) alternating all on / all off twice, then 1.7B c=1 once each. Keep each that makes the
# codec's calls faster without a loss at c=1; if a GPU test fails, its switch off (=0) and mend. Session 39 ran on an
# H100 lent for an H200: compare within the call.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK
gpu_tests 240 tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_codec_small_kernels.py \
  -k "write_back_rows or kv_window or window_attention or rope_table or context_exchange or graph_path_equals \
  or fp16_streaming or epilogues"
pack_results
profile_codec_16 both
profile_codec_16 no_writer VOXFLOW_CODEC_STATE_WRITER=0
profile_codec_16 no_window_attention VOXFLOW_CODEC_WINDOW_ATTENTION=0
profile_codec_16 no_context_kernel VOXFLOW_CODEC_CONTEXT_KERNEL=0
off() {                                # a command with the three of them off
  (export VOXFLOW_CODEC_STATE_WRITER=0 VOXFLOW_CODEC_WINDOW_ATTENTION=0 VOXFLOW_CODEC_CONTEXT_KERNEL=0; "$@")
}
off profile_codec_16 neither
pack_results
wait $CK6
for i in 1 2; do
  bench_small_traced both_$i
  off bench_small_traced neither_$i
done
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
bench_1p7b_at 1 both                   # the thin target: 1.7B c=1 RTF <= 0.04 (its codec calls are 1-5 frames)
off bench_1p7b_at 1 neither
pack_results
echo "done at ${SECONDS}s"
