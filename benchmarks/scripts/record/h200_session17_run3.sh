#!/usr/bin/env bash
# Session 17, call 3 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".whl-official", ".device_tree"]):
#  1. GPU tests: the folded code-predictor layers with in-place residual adds (95ce380), the amended dense-attention
#     rule, the engine with a burst's prompts built in one batched pass (fp32 engine == the CPU reference, text
#     rows, no hidden host sync incl. the base checkpoint);
#  2. a burst's prompt builds one by one vs batched (bench_prepare_batch.py, 56 requests);
#  2b. the paged decode's launch candidates at 64 rows over the served contexts (tune_paged_decode.py --matrix);
#  3. profile_step c=64 with the folded layers on and off (A/B on one machine);
#  4. HTTP c=64 with the defaults (batched prompt builds, folded layers);
#  5. offline 0.6B c=64 in the <= 8 GB configuration.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
gpu_tests 110 "tests/gpu/test_gpu_cp_layer.py::test_predict_folded_norms_on_vs_off" \
  tests/gpu/test_gpu_dense_attention.py tests/gpu/test_gpu_text_rows.py tests/gpu/test_gpu_no_host_sync.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
timeout 60 python3 benchmarks/scripts/tune_paged_decode.py --matrix --rows 64 --contexts 64,128,192 2>&1 \
  | grep -v Warn > $R/tune_paged_decode_matrix.txt
tail -3 $R/tune_paged_decode_matrix.txt
wait $CK
timeout 40 python3 benchmarks/scripts/bench_prepare_batch.py /tmp/real-1.7b 56 5 cuda 2>&1 | grep -v Warn \
  > $R/bench_prepare_batch.txt
tail -4 $R/bench_prepare_batch.txt
timeout 90 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_folded.txt
grep -E "ms per step" $R/profile_step_64_folded.txt
VOXFLOW_FOLDED_NORMS=0 timeout 60 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_unfolded.txt
grep -E "ms per step" $R/profile_step_64_unfolded.txt
echo "profiles done at ${SECONDS}s"
if [ $SECONDS -lt 400 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
wait $CK6
if [ $SECONDS -lt 490 ]; then
  timeout 95 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-0.6b --label small-8gb --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
    --output $R/h200_0p6b_offline_c64_8gb.json.gz 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
