#!/usr/bin/env bash
# Session 54 call 2; carry [".whl", ".device_tree"]. ~500 s (a fresh machine compiles the kernels); ordered so that
# a call cut short by the session's device budget keeps the most: the test, the codec profile, c=64, c=16, c=1.
# First the one GPU test call 1's whole-suite run failed on an import (as in sessions 15-41): the carried
# huggingface_hub 0.36 shadowed the hub of the image's transformers 5.x; h200_targets.sh now installs that hub only
# with the official stage's transformers (.whl-official, which the tree + .whl no longer leave room to carry).
# Then the codec alone (16 streams, fp16 on 64 SMs, 5- and 25-frame calls) with one call's kernels listed in launch
# order: what each level of the waveform stack costs, for the codec work that the 0.6B target needs next. Then the
# 1.7B over HTTP at c=64, 16, 1 on one server at today's defaults: the target rows for those are session 36's HTTP
# runs (632.2 audio-s/s at c=64), before the pipelined decode attention (session 51; offline 1.7B c=64 +7.5%,
# session 53) and the fused residual unit (session 49).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
python3 -c "import transformers, huggingface_hub as h; print('transformers', transformers.__version__, 'hub', h.__version__)" \
  | tee "$R/versions.txt"
gpu_tests 120 tests/gpu/test_gpu_no_host_sync.py
pack_results
wait $CK
timeout 150 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16+sms64 5,25 40 --sequence 2>&1 \
  | grep -v -i warn > "$R/profile_codec_sequence.txt"
grep -E "per call" "$R/profile_codec_sequence.txt"
pack_results
if serve_variant defaults; then
  bench_http_at 64 c64_defaults
  pack_results
  bench_http_at 16 c16_defaults
  pack_results
  bench_http_at 1 c1_defaults
  stop_server defaults
fi
report_runs
pack_results
echo "done at ${SECONDS}s"
