#!/usr/bin/env bash
# Session 26 call 1 (prepared in session 25), tree 3cf2c1c, 322 s on the H200: results in
# benchmarks/results/h200/2026-12-04-session26/call1. `bash benchmarks/scripts/stamp_tree.sh` first; carry
# [".whl", ".device_tree"].
# 1. The 0.6B c=64 <= 8 GB baseline on unique prompts (device_lib.sh's default since session 25), twice: the 800
#    audio-s/s target's honest starting point and its run-to-run spread on one machine.
# 2. A cheap A/B on cuBLAS's split-K: at 64 rows 103 GEMMs a step run split-K with a separate reduce kernel
#    (2.0 us each, ~0.2 ms of a 5.7 ms step; session 24 call 5). Without a workspace cuBLAS cannot pick those:
#    PyTorch reads CUBLAS_WORKSPACE_CONFIG (cublasGemmEx, the bias-free GEMMs) and CUBLASLT_WORKSPACE_SIZE (KiB,
#    the Lt path), both set to zero here. The step profile must show splitKreduce_kernel gone (else the A/B tested
#    nothing) and which kernels cuBLAS picks instead; the bench, whether the step got shorter.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
bench_small_traced base_a
bench_small_traced base_b
CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 bench_small_traced nows
pack_results
for v in base nows; do
  ws=(); [ $v = nows ] && ws=(CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0)
  env "${ws[@]}" timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-0.6b 64 --no-eager --stagger \
    codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v Warn > $R/profile_step_0p6b_64_$v.txt
  head -20 $R/profile_step_0p6b_64_$v.txt
done
pack_results
# 3. Offline c=256 (the best-concurrency target, >= 1,000 audio-s/s) on unique prompts: session 25's 1,215.0 took
#    83% of its prompt positions from the prefix cache (512 prompts from the 66 bundled).
real_checkpoint_bg
wait $CK
bench_offline unique
echo "done at ${SECONDS}s"
