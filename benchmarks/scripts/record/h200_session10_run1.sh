#!/usr/bin/env bash
# Prepared in session 9 (device time spent) for the next session's first call, carry [".whl"]: programmatic
# dependent launch (voxflow/kernels/pdl.py, VOXFLOW_PDL=1; off by default, never run on a GPU yet).
#  1. GPU tests: PDL on == off bit for bit (chained kernels, a CUDA graph, a 1.7B code-predictor frame), the
#     engine with PDL == the CPU reference, the skinny / cp-layer kernels with PDL off (default path unchanged);
#  2. tune_pdl.py: a frame's layer steps and predict() at 1 and 4 rows, PDL off / on;
#  3. HTTP c=1 (RTF target 0.04) and c=64, PDL off / on; the c=1 step profile with PDL on; c=64 with first chunks
#     of 5 frames (the engine picks 10 above 32 streams: TTFP's first_chunk part was 71-115 ms in session 9).
# Decide: PDL on by default (VOXFLOW_PDL default "1" on Hopper) if c=1 RTF improves and c=64 is not worse.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 200 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_pdl.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_with_programmatic_dependent_launch_equals_cpu_reference" \
  tests/gpu/test_gpu_skinny_linear.py tests/gpu/test_gpu_cp_layer.py > $R/gpu_tests.txt 2>&1
grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -6
timeout 120 python3 benchmarks/scripts/tune_pdl.py --rows 1,4 > $R/tune_pdl.txt 2>&1
grep -v Warn $R/tune_pdl.txt | tail -6
wait $ck
for variant in pdloff pdlon; do
  [ $variant = pdlon ] && export VOXFLOW_PDL=1
  if serve_variant $variant; then
    bench_http --label http-$variant --concurrency 1 --num-prompts 4 --num-warmups 1 --output $R/h200_1p7b_http_c1_$variant.json
    bench_http --label http-$variant --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --output $R/h200_1p7b_http_c64_$variant.json
    # c=64 first chunks of 5 frames instead of the engine's 10 above 32 streams (codec_executor.
    # initial_frames_for_load, never measured): session 9's c=64 first_chunk part was 71-115 ms of the TTFP.
    [ $variant = pdloff ] && bench_http --label http-first5 --concurrency 64 --num-prompts 256 --num-warmups 8 \
      --extra-body '{"initial_codec_chunk_frames": 5}' --output $R/h200_1p7b_http_c64_first5.json
  fi
  stop_server $variant
done
[ $SECONDS -lt 480 ] && timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_1_pdl.txt
unset VOXFLOW_PDL
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
