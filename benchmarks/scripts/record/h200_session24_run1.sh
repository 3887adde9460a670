#!/usr/bin/env bash
# Session 24 call 1 (prepared in session 23; ran on tree f71c7f3 in 310 s).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl",
# ".device_tree"]. About 450 s. The token draw's top-k radix select deciding only the key bits that bf16 logits
# have (16 instead of 32: select_tokens.key_bits, exact, CPU-tested in Triton's interpreter only): its GPU tests
# (the kernel against the reference; the bf16 engine's sampled codes equal with 16 and 32 key bits), its kernel time
# against all 32 bits (bench_select_tokens.py: rows keys16 / keys32, bf16 logits), then A/Bs
# on one machine with VOXFLOW_SELECT_FULL_KEYS=1 (all 32 bits, as before): 1.7B c=1 (the RTF target, 0.04; each
# frame makes 15 draws from bf16 logits) and 0.6B c=64.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 240 tests/gpu/test_gpu_select_tokens.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_sampled_codes_equal_with_16_and_32_key_bits"
timeout 150 python3 benchmarks/scripts/bench_select_tokens.py > $R/bench_select_tokens.txt 2>&1
grep "^B=" $R/bench_select_tokens.txt
pack_results
wait $CK
bench_1p7b_at 1 keys16
VOXFLOW_SELECT_FULL_KEYS=1 bench_1p7b_at 1 keys32
bench_1p7b_at 1 keys16b
pack_results
wait $CK6
bench_small_traced keys16
VOXFLOW_SELECT_FULL_KEYS=1 bench_small_traced keys32
echo "done at ${SECONDS}s"
