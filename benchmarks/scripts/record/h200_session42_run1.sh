#!/usr/bin/env bash
# Prepared in session 41 (after its device time); carry [".whl", ".device_tree"] (+ ".whl-official" only if the
# Base model's tests are added). Run as session 42 call 1. ~480 s.
# 1. codec_waveform_cl.ONE_CHANNEL_KERNEL (VOXFLOW_CODEC_ONE_CHANNEL_KERNEL, off until measured): the codec's last
#    layer (96 channels -> the waveform, k=7) as row dot products (kernels/conv_to_one_channel.py, 54 registers,
#    no spills on sm_90) instead of a 16-column tensor-core tile of which one column is stored (0.31 ms, ~3% of a
#    16-stream 25-frame call on 64 H100 SMs, session 41 call 4). GPU tests: the kernel against float64 conv1d and the
#    tensor-core kernel at the real shape, then the codec's graph path / fp16 SNR tests with it on. Then the codec
#    alone (16 streams, fp16, 64 SMs, 1 / 5 / 25 frames) off / on. Adopt (default "1") if the calls' kernel time
#    drops and the tests pass.
# 2. The prefill budget at a closed-loop 0.6B c=64 wave's edge: max_num_batched_tokens 8,192 against the default
#    4,096 (twice each, alternating). Session 41's traces: a wave's 64 prompts (~11k positions) take three prefill
#    steps at 4,096, so the wave's requests start (and end) up to two steps apart, and ~5% of a run's row-steps
#    are partial steps at the wave edges. Session 26 measured 8,192 slower at 1.7B c=256 (43k positions a wave);
#    0.6B c=64 was never measured. Watch the peak memory (the <= 8 GB target: the traced runs' 2.4 GB pool reads
#    ~7.62 GiB) and the steps' medians (`summarize_steps`).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 200 tests/gpu/test_gpu_codec_small_kernels.py -k one_channel
echo "  at ${SECONDS}s"
mv "$R/gpu_tests.txt" "$R/gpu_tests_kernel.txt"
(export VOXFLOW_CODEC_ONE_CHANNEL_KERNEL=1
 gpu_tests 200 tests/gpu/test_gpu_codec.py -k "graph_path_equals or fp16 or fused_codec_kernels")
echo "  at ${SECONDS}s"
pack_results
wait $CK
profile_codec_16 defaults
profile_codec_16 one_channel VOXFLOW_CODEC_ONE_CHANNEL_KERNEL=1
pack_results
wait $CK6
for i in 1 2; do
  bench_small_traced tok4k_$i
  bench_small_traced tok8k_$i --engine-arg max_num_batched_tokens=8192
  summarize_steps "steps_0p6b_*.jsonl" 16
  pack_results
done
echo "done at ${SECONDS}s"
