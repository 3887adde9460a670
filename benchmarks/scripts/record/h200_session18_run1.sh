#!/usr/bin/env bash
# (The kernel changes this call measured were removed afterwards: 2443208 and 474f20f reverted; see
# benchmarks/results/h200/2026-12-03-session18/README.md.)
# Session 18, call 1 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]):
#  1. GPU tests: the paged decode with chunks of >= min_split_tokens (2443208), in graphs and through the engine;
#  2. tune_paged_decode.py --chunks: tile x shortest chunk x context at 16 / 64 / 256 rows, beside the previous
#     kernel module (2443208~1) as the baseline;
#  3. profile_step c=64: the default (chunks >= 64 tokens at 64 rows) vs VOXFLOW_PAGED_MIN_SPLIT=0 (one tile);
#  4. HTTP c=64 with the defaults;
#  5. offline 0.6B c=64 in the <= 8 GB configuration, with a step trace (where its time goes).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
gpu_tests 90 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
timeout 110 python3 benchmarks/scripts/tune_paged_decode.py --chunks --baseline benchmarks/scripts/.baseline_pda.py \
  --rows 16,64,256 --contexts 64,128,192,320,640,1280,2048 2>&1 | grep -v Warn > $R/tune_paged_decode_chunks.txt
grep -E "^rows|default|baseline" $R/tune_paged_decode_chunks.txt
echo "tune done at ${SECONDS}s"
wait $CK
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_default.txt
VOXFLOW_PAGED_MIN_SPLIT=0 timeout 60 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_one_tile.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_one_tile.txt
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
    --engine-arg kv_cache_bytes=2000000000 --engine-arg trace_steps=$R/steps_0p6b_offline.jsonl --concurrency 64 \
    --num-prompts 192 --num-warmups 8 --max-num-seqs 64 --output $R/h200_0p6b_offline_c64_8gb.json.gz 2>&1 \
    | grep -v "^\s*$" | tail -2
  gzip -f $R/steps_0p6b_offline.jsonl
fi
echo "done at ${SECONDS}s"
