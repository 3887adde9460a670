#!/usr/bin/env bash
# Session 22 call 3. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 500 s.
# codec_sms now defaults to "auto" (half the SMs where CUDA green contexts exist: 64 of an H200's 132), after call 2
# measured 0.6B c=64 at 656 (whole GPU) / 681 (96 SMs) / 698 (64) / 663 (48) / 640 (32) audio-s/s. This call holds
# the default against codec_sms=none on one machine: 0.6B c=64 (<= 8 GB config), 1.7B offline c=64 and c=1 (first
# audio latency: does the codec on half the GPU delay a lone request's first chunk?), and 0.6B with 80 SMs; then
# the two GPU tests that check "auto" (the codec runner's partition, the engine's startup record).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg

bench_1p7b() {   # LABEL CONCURRENCY PROMPTS [ARGS]: 1.7B offline, 151 frames, into $R/h200_1p7b_offline_cN_LABEL.*
  timeout 150 python3 -m voxflow.bench --model /tmp/real-1.7b --device cuda --dtype bfloat16 --max-new-tokens 151 \
    --ignore-eos --no-progress --no-plots --label "1p7b-$1" --concurrency $2 --num-prompts $3 --num-warmups 4 \
    --max-num-seqs 64 --output "$R/h200_1p7b_offline_c$2_$1.json.gz" "${@:4}" 2>&1 | grep -v "^\s*$" | tail -1
  grep -E "^\| c=|breakdown" "$R/h200_1p7b_offline_c$2_$1.md"
  echo "  at ${SECONDS}s"
}

wait $CK6
bench_small_traced auto
bench_small_traced whole --engine-arg codec_sms=none
wait $CK
bench_1p7b auto 64 192
bench_1p7b whole 64 192 --engine-arg codec_sms=none
bench_1p7b auto 1 12
bench_1p7b whole 1 12 --engine-arg codec_sms=none
bench_small_traced sms80 --engine-arg codec_sms=80
gpu_tests 120 "tests/gpu/test_gpu_codec.py::test_codec_on_an_sm_partition_equals_the_whole_gpu" \
  "tests/gpu/test_gpu_engine.py::test_gpu_memory_limit_caps_the_allocator_and_the_total_is_reported"
gzip -f $R/steps_0p6b_*.jsonl
echo "done at ${SECONDS}s"
