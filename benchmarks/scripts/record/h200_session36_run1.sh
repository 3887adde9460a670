#!/usr/bin/env bash
# Prepared in session 35, run as session 36 call 1; carry [".whl", ".device_tree"].
# CP_SPLIT_PREFILL (voxflow/models/qwen3_tts/code_predictor.py, off until this has run): above one row, the code
# predictor's 2-token first step position by position through the folded single-token layers (~7 launches a layer)
# instead of the per-layer path with eager attention (~22). Why: session 35 call 2's 0.6B c=64 timeline, that step
# ~0.6 ms of a 6.25 ms step against ~0.27 for each single-token step, and beside the codec each launch ~1.9 us more.
# 1. GPU test: 64 rows, fp32 / bf16, on vs off (codes up to near-ties, logits within 1e-4 / 5e-2, no eager attention).
# 2. 0.6B c=64 (<= 8 GB) off / on / off again, one machine, step traces; a timeline with it on (the `beside` table).
# 3. 1.7B c=64 off / on. ~450 s.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 150 "tests/gpu/test_gpu_cp_layer.py::test_predict_split_prefill_on_vs_off" \
  "tests/gpu/test_gpu_cp_layer.py::test_predict_folded_norms_on_vs_off"
pack_results
wait $CK6
bench_small_traced defaults
(export VOXFLOW_CP_SPLIT_PREFILL=1; bench_small_traced split_prefill)
bench_small_traced defaults_again
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
VOXFLOW_CP_SPLIT_PREFILL=1 timeout 150 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 \
  "$R/timeline_small_c64_stagger_split.json.gz" --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 \
  | grep -v -i warn | tail -1
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64_stagger_split.json.gz" \
  > "$R/timeline_small_c64_stagger_split.txt"
head -1 "$R/timeline_small_c64_stagger_split.txt"
pack_results
wait $CK
bench_1p7b_at 64 c64_defaults
(export VOXFLOW_CP_SPLIT_PREFILL=1; bench_1p7b_at 64 c64_split_prefill)
pack_results
echo "done at ${SECONDS}s"
