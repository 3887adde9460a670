#!/usr/bin/env bash
# Prepared in session 54 (zero code: engine arguments only); carry [".whl", ".device_tree"]; rename when run. ~450 s
# (a fresh machine is fine: the first server compiles the kernels).
# Fewer, larger codec calls at 0.6B c=64 over HTTP. A 16-stream codec call costs ~1.4-1.8 ms before its frames
# (session 49, H100 on 64 SMs: 1.76 ms at 1 frame, 3.59 at 5, 10.72 at 25), and each request's 150 frames go out in
# 12 chunks (5, 5, 10, 10, 25 x 4, then the tail's 5 x 4): ~a quarter of the codec's time a request is per-call
# cost, and the codec beside the talker is the run's largest loss (~11% of the span, session 53). Without the ramp
# and with tail pieces of 10 a request takes 8 chunks (5, 25 x 5, 10, 10). The ramp exists so that no stream
# underruns at any pace (each chunk at most the audio already sent); at c=64 a step is ~6 ms (RTF ~0.08), so 25
# frames come well inside the first chunk's 0.4 s, except on the slow prefill steps of a wave's edge: the bench's
# underrun column says whether any stream starved. Alternating: defaults against chunk_ramp=false +
# codec_tail_chunk=10.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small d_0                                                       # (the first server compiles the kernels)
pack_results
for run in few_1 d_1 few_2 d_2; do
  (( SECONDS < ${UNTIL:-500} )) || break
  if [[ $run == few_* ]]; then
    http_small $run --engine-arg chunk_ramp=false --engine-arg codec_tail_chunk=10
  else
    http_small $run
  fi
  pack_results
done
wrap_up "steps_http_*.jsonl*" 20
