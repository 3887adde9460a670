#!/usr/bin/env bash
# Session 26 call 5 (the session's last ~240 s of device time): the GPU tests of the talker's decode with the
# per-head norms and RoPE inside the paged decode kernel (paged_decode_attention's norm_rope, on by default): the
# one-row (c=1) layers and the fp32 engine against the CPU reference's codes, and the kernel variant against
# qk_norm_rope + the plain kernel at the talker's shapes. Output straight into $OUT (a call cut at the budget's end
# keeps what ran). Carry [".whl", ".device_tree"].
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
timeout 170 python3 -m pytest -rfs --tb=short -p no:cacheprovider -q \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" \
  tests/gpu/test_gpu_paged_attention.py -k "norm_rope or one_row or fp32_engine" > $OUT/gpu_tests.txt 2>&1
tail -15 $OUT/gpu_tests.txt
