#!/usr/bin/env bash
# Prepared in session 41; carry [".whl", ".device_tree"]. Run as session 42 call 2. ~380 s.
# The 0.6B c=64 target as issue 6 states it: streamed PCM over HTTP on loopback (`voxflow serve` + `voxflow bench
# --base-url`), in the <= 8 GB configuration (a 2 GB KV pool, codec calls of <= 16), which no session has measured:
# every 0.6B figure so far is the offline bench (engine in the bench's process; session 36's H200: 709.0-714.8). At
# 1.7B c=64 HTTP ran 5-7% below offline (609.9 against 643-654, sessions 26 / 36). Two HTTP runs on one server
# (the server's step trace, /health with its whole GPU footprint), then the offline bench on the same machine; the
# step traces say whether the serving process's host phases (chunks out over IPC and HTTP) slow its steps.
# Then, offline: torch's matmuls through cuBLASLt (TORCH_BLAS_PREFER_CUBLASLT=1; never tried here) against the
# default cuBLAS, whose heuristics pick the 64-row GEMMs that are most of a step (nvjet kernels at 0.7-1.4 TB/s,
# with split-K reduces for down_proj: session 40's timeline). Its own heuristic may pick other kernels; the GEMMs'
# summation order may then differ, so adopting it would need the GPU engine tests too.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
if serve_small defaults; then
  bench_http_small defaults
  bench_http_small defaults_again
  stop_server defaults
fi
pack_results
bench_small_traced offline
(export TORCH_BLAS_PREFER_CUBLASLT=1; bench_small_traced cublaslt)
bench_small_traced offline_again
summarize_steps "steps_*" 16
echo "done at ${SECONDS}s"
