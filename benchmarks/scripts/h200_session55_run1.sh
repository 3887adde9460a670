#!/usr/bin/env bash
# Session 55 call 1 (prepared in session 54); carry [".whl", ".device_tree"]. ~520 s (a fresh machine is fine: the
# first server compiles the kernels). UNTIL (default 500 s) stops the A/B's loop.
# 1. The Base GPU test that failed on imports in session 54 (the image's transformers 5.x under the carried
#    huggingface_hub / tokenizers): h200_targets.sh now leaves the image's own to it.
# 2. Fewer, larger codec calls at 0.6B c=64 over HTTP, alternating. Session 54 call 2 (H100): chunk_ramp off +
#    codec_tail_chunk=10 (8 chunks a request against 12) 753.5 / 737.1 audio-s/s against 722.4 / 721.5, but 8 / 16
#    of 640 streams underran once (<= 14 ms), each at its first 25-frame chunk at a wave's start. Here
#    chunk_ramp_factor=2 + codec_tail_chunk=10: also 8 chunks (5, 10, 25 x 5, 10), the second one 10 frames. If it
#    keeps the gain with every stream whole, it becomes the default (the bench's "no underrun" column).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
python3 -c "import transformers, tokenizers, huggingface_hub as h
print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hub', h.__version__)" \
  | tee "$R/versions.txt"
gpu_tests 120 tests/gpu/test_gpu_no_host_sync.py
pack_results
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in f2_1 d_1 f2_2 d_2 f2_3; do
  (( SECONDS < ${UNTIL:-500} )) || break
  if [[ $run == f2_* ]]; then
    http_small $run --engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
wrap_up "steps_http_*.jsonl*" 20
