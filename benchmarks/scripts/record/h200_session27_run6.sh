#!/usr/bin/env bash
# Session 27 call 6 (tree dac7f72, 220 s); carry [".whl", ".device_tree"].
# This session's final defaults: codec convolutions through TMA on by default (call 2), the paged norm_rope and
# last-split merge removed (call 1), the weight prefetch removed (calls 4-5).
# 1. GPU tests: the paged attention file (the default paths after the removal), the TMA codec test, the fp32 engine
#    against the CPU reference's codes;
# 2. 0.6B c=64 in the <= 8 GB configuration with a step trace (target 800 audio-s/s; 694-697 in call 2);
# 3. 1.7B c=1 (RTF target 0.04; 0.044).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_codec.py::test_tma_convolutions_equal_the_pointer_kernel_and_keep_the_fp16_snr" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
pack_results
wait $CK6
bench_small_traced defaults
pack_results
wait $CK
bench_1p7b_at 1 defaults
echo "done at ${SECONDS}s"
