#!/usr/bin/env bash
# Session 41 call 4; carry [".whl", ".device_tree"]. ~450 s.
# 1. GPU tests after this session's changes: the code predictor's folded head on by default (CP_FOLDED_HEAD), the
#    graph-captured copies (GRAPH_COPIES) and the attention-in-registers form removed: the fp32 engine against the
#    CPU loop (graphs on / off, above the skinny sizes: the folded head's path), no hidden host sync.
# 2. The codec convolutions' tiles retuned where the served codec runs: 16 streams x 25 frames (codec_call_rows=16),
#    fp16, on 64 SMs of the green context (tune_causal_conv.py; session 15 tuned them on a whole H200, before the
#    TMA kernel, the epilogues and the sub-pixel convolutions). Per shape: the current config, then the candidates,
#    TFLOP/s each; then the whole 16-stream call at 1 / 10 / 25 frames with the current table and with the winners.
#    Why: the convolutions are 9.09 of a 25-frame call's 10.84 ms of kernel time (session 40), ~43% of the fp16
#    tensor-core peak of 64 H100 SMs, and the codec's time beside the talker is ~12% of a 0.6B c=64 run.
# 3. 0.6B c=64 on this session's defaults (a step trace), for the record.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 150 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py \
  -k "fp32_engine_equals_cpu_reference or above_the_skinny or no_hidden_synchronisation"
echo "  at ${SECONDS}s"
pack_results
timeout 330 python3 benchmarks/scripts/tune_causal_conv.py 16 25 float16 64 > "$R/tune_conv_fp16_b16_f25_sms64.txt" 2>&1
grep -E "^BEST|^codec|^NONE|Error" "$R/tune_conv_fp16_b16_f25_sms64.txt" | tail -30
echo "  at ${SECONDS}s"
pack_results
wait $CK6
bench_small_traced defaults
summarize_steps "steps_0p6b_*.jsonl" 16
echo "done at ${SECONDS}s"
