#!/usr/bin/env bash
# Session 31 call 3; carry [".whl", ".device_tree"]. This tree adds to call 2's: the decode step's write-back (the
# new per-slot state scattered back, the finished / EOS flags side by side) as one fused kernel instead of ~12
# torch kernels (kernels/slot_write_back.py), and the one-row codec_head on the skinny GEMM by default.
# 1. GPU tests: the write-back kernel against the torch ops (eager and graphed), the fp32 engine against the CPU
#    reference, no host syncs in a step;
# 2. 1.7B c=1 benches: the defaults twice; the write-back kernel off; the skinny codec_head off;
# 3. 1.7B c=1 over HTTP (the target's setting); 4. 0.6B c=64 (<= 8 GB configuration).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 200 tests/gpu/test_gpu_slot_write_back.py tests/gpu/test_gpu_no_host_sync.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
echo "  at ${SECONDS}s"
pack_results
wait $CK
bench_1p7b_at 1 defaults
pack_results
bench_1p7b_at 1 defaults_again
pack_results
(export VOXFLOW_WRITE_BACK_KERNEL=0; bench_1p7b_at 1 write_back_torch)
pack_results
(export VOXFLOW_SKINNY_CODEC_HEAD=0; bench_1p7b_at 1 codec_head_cublas)
pack_results
if serve_variant c1; then
  bench_http_at 1 c1
  stop_server c1
fi
pack_results
wait $CK6
bench_small_traced defaults
summarize_steps "steps_*.jsonl" 12
echo "done at ${SECONDS}s"
