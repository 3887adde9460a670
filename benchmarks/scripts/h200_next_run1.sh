#!/usr/bin/env bash
# Prepared in session 44 (no machine came for it); carry [".whl", ".device_tree"]; rename when run. ~420 s.
# CP_JOINT_PREFILL is the default since session 44 (its calls 1-2), at every row count.
# (Run in the order 2, 1, 3, 4.)
# 1. GPU tests whose counts follow the new default (the fused layer at one row, folded norms and split prefill at
#    64 rows held to their own paths), the joint ones, and the engine above the skinny sizes (split held) and joint.
# 2. probe_gemm_layouts.py: whether cuBLAS serves the code predictor's 64- / 128-row GEMMs faster with the weight
#    stored [K, N] (torch.mm) than F.linear's [N, K], or with fp32 split-K reductions (no engine change).
# 3. 0.6B c=64 over HTTP on the new defaults, a second server (session 44 call 1: 741.08).
# 4. A kernel timeline of the 0.6B c=64 step on the new defaults (staggered requests, the <= 8 GB configuration),
#    session 40's table with the joint pass.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
timeout 90 python3 benchmarks/scripts/probe_gemm_layouts.py > $R/probe_gemm_layouts.txt 2>&1
cat $R/probe_gemm_layouts.txt | cut -c1-300
pack_results
gpu_tests 150 tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_engine.py \
  -k "fused_layer_on_vs_off or folded_norms_on_vs_off or split_prefill or joint or above_the_skinny"
echo "  at ${SECONDS}s"
pack_results
wait $CK6
if serve_small defaults; then
  bench_http_small defaults
  stop_server defaults
fi
grep -h "^| c=" $R/h200_0p6b_http_c64_defaults.md
pack_results
timeout 100 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 \
  "$R/timeline_small_c64_stagger_joint.json.gz" --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 \
  | grep -v -i warn | tail -3
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64_stagger_joint.json.gz" \
  > "$R/timeline_small_c64_stagger_joint.txt"
head -14 "$R/timeline_small_c64_stagger_joint.txt" | cut -c1-150
echo "done at ${SECONDS}s"
