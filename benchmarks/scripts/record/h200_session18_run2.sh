#!/usr/bin/env bash
# (The kernel changes this call measured were removed afterwards: 2443208 and 474f20f reverted; see
# benchmarks/results/h200/2026-12-03-session18/README.md.)
# Session 18, call 2 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree",
# "benchmarks/scripts/.baseline_pda.py"]; the results come back as one archive, r.tgz: a call returns 8 files at most,
# and call 1 lost its tune table and traces to that limit):
#  1. GPU tests: the paged decode with the merge done by each row's last chunk program (arrival counters), chunks
#     of >= min_split_tokens, in graphs and through the engine;
#  2. tune_paged_decode.py --chunks at 1 / 64 / 256 rows beside the session-17 kernel module (the baseline);
#  3. profile_step c=64: the default vs VOXFLOW_PAGED_DECODE_LAUNCH="fused_merge=0,min_split_tokens=16" (session 17's
#     launch in today's kernel), A/B on one machine;
#  4. HTTP c=64 with the defaults;
#  5. offline 0.6B c=64 in the <= 8 GB configuration, with a step trace;
#  6. if time is left: profile_step c=1, default vs the merge kernel.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
trap 'tar czf $OUT/r.tgz -C /tmp r' EXIT TERM
real_checkpoint_bg
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-0.6b --variant custom_voice --size 0.6B > /dev/null 2>&1 &
CK6=$!
gpu_tests 75 tests/gpu/test_gpu_paged_attention.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
timeout 90 python3 benchmarks/scripts/tune_paged_decode.py --chunks --baseline benchmarks/scripts/.baseline_pda.py \
  --rows 64,256,1 --contexts 64,128,192,384,1024 2>&1 | grep -v Warn > $R/tune_paged_decode_chunks.txt
cat $R/tune_paged_decode_chunks.txt | cut -c1-140
echo "tune done at ${SECONDS}s"
wait $CK
timeout 150 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_default.txt
VOXFLOW_PAGED_DECODE_LAUNCH="fused_merge=0,min_split_tokens=16" timeout 60 python3 benchmarks/scripts/profile_step.py \
  /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn > $R/profile_step_64_session17_launch.txt
grep -E "ms per step|paged_decode|combine" $R/profile_step_64_session17_launch.txt
echo "profiles done at ${SECONDS}s"
if [ $SECONDS -lt 380 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
wait $CK6
if [ $SECONDS -lt 470 ]; then
  timeout 95 python3 -m voxflow.bench --dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots \
    --device cuda --model /tmp/real-0.6b --label small-8gb --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --engine-arg trace_steps=$R/steps_0p6b_offline.jsonl --concurrency 64 \
    --num-prompts 192 --num-warmups 8 --max-num-seqs 64 --output $R/h200_0p6b_offline_c64_8gb.json.gz 2>&1 \
    | grep -v "^\s*$" | tail -2
  gzip -f $R/steps_0p6b_offline.jsonl
fi
if [ $SECONDS -lt 480 ]; then
  timeout 60 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_1_default.txt
  VOXFLOW_PAGED_DECODE_LAUNCH="fused_merge=0" timeout 40 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 \
    --no-eager 2>&1 | grep -v Warn > $R/profile_step_1_merge_kernel.txt
  grep -h "ms per step" $R/profile_step_1_*.txt
fi
echo "done at ${SECONDS}s"
