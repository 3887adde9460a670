#!/usr/bin/env bash
# Session 54 call 2; carry [".whl", ".device_tree"]. ~550 s (a fresh machine compiles the kernels); ordered so that a
# call cut short by the session's device budget keeps the most. UNTIL (default 520 s) stops the A/B's loop.
# 1. The one GPU test call 1's whole-suite run failed on an import (as in sessions 15-41): the carried
#    huggingface_hub 0.36 shadowed the hub of the image's transformers 5.x; h200_targets.sh now installs that hub
#    only with the official stage's transformers (.whl-official, which the tree + .whl no longer leave room to carry).
# 2. The codec alone (16 streams, fp16 on 64 SMs, 5- and 25-frame calls; the 0.6B's codec is the 1.7B's) with one
#    call's kernels listed in launch order: what each level of the waveform stack costs.
# 3. Fewer, larger codec calls at 0.6B c=64 over HTTP (prepared as h200_next_run1.sh, whose header says why):
#    the defaults against chunk_ramp=false + codec_tail_chunk=10 (12 -> 8 chunks a request), alternating.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
python3 -c "import transformers, huggingface_hub as h; print('transformers', transformers.__version__, 'hub', h.__version__)" \
  | tee "$R/versions.txt"
gpu_tests 120 tests/gpu/test_gpu_no_host_sync.py
pack_results
wait $CK6
timeout 150 python3 benchmarks/scripts/profile_codec.py /tmp/real-0.6b 16 fp16+sms64 5,25 40 --sequence 2>&1 \
  | grep -v -i warn > "$R/profile_codec_sequence.txt"
grep -E "per call" "$R/profile_codec_sequence.txt"
pack_results
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in few_1 d_1 few_2 d_2; do
  (( SECONDS < ${UNTIL:-520} )) || break
  if [[ $run == few_* ]]; then
    http_small $run --engine-arg chunk_ramp=false --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
wrap_up "steps_http_*.jsonl*" 20
