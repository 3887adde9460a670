#!/usr/bin/env bash
# (A record of call 4 as it ran: the talker's folded norms it measured, and their switch VOXFLOW_FOLDED_NORMS_PAGED,
# were removed after it (f91fd33), as was the paged decode's wide-tile launch (db6fcac).)
# Session 17, call 4, the last (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]):
#  1. GPU tests of what changed since call 3: the paged decode's one split of wide tiles from 64 rows (e70faae),
#     the folded norms through the talker's paged cache (74dda5e: qk_norm_rope folded=), the fp32 engine (12
#     requests above the skinny sizes, graphs / kernels variants, packed prefill, PDL) == the CPU reference;
#  2. profile_step c=64 with the defaults and with the talker's folded norms off (A/B on one machine);
#  3. HTTP c=64 with the defaults (the README's row), then c=1 and c=16 on the same server;
#  4. offline 0.6B c=64 in the <= 8 GB configuration.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
E=tests/gpu/test_gpu_engine.py
gpu_tests 200 $E::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference \
  tests/gpu/test_gpu_paged_attention.py tests/gpu/test_gpu_qk_norm_rope.py \
  "tests/gpu/test_gpu_cp_layer.py::test_predict_folded_norms_on_vs_off" \
  $E::test_gpu_fp32_engine_equals_cpu_reference $E::test_gpu_packed_prefill_equals_cpu_reference \
  $E::test_gpu_engine_codes_equal_with_pdl_on_and_off
echo "tests done at ${SECONDS}s"
wait $CK
timeout 80 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step" $R/profile_step_64_default.txt
VOXFLOW_FOLDED_NORMS_PAGED=0 timeout 50 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager \
  2>&1 | grep -v Warn > $R/profile_step_64_talker_unfolded.txt
grep -E "ms per step" $R/profile_step_64_talker_unfolded.txt
echo "profiles done at ${SECONDS}s"
if [ $SECONDS -lt 390 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
  [ $SECONDS -lt 470 ] && bench_http --label http-default-c1 --concurrency 1 --num-prompts 12 --num-warmups 2 \
    --output $R/h200_1p7b_http_c1_default.json.gz
  [ $SECONDS -lt 490 ] && bench_http --label http-default-c16 --concurrency 16 --num-prompts 64 --num-warmups 4 \
    --output $R/h200_1p7b_http_c16_default.json.gz
fi
stop_server default
wait $CK6
if [ $SECONDS -lt 470 ]; then
  timeout 95 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-0.6b --label small-8gb --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
    --output $R/h200_0p6b_offline_c64_8gb.json.gz 2>&1 | grep -v "^\s*$" | tail -2
fi
echo "done at ${SECONDS}s"
