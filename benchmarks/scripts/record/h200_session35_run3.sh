#!/usr/bin/env bash
# Session 35 call 3 (the session's last ~430 s of device time); carry [".whl", ".device_tree"].
# Call 2 measured codec_tail_chunk=5 + codec_call_rows=16 at c=64 (0.6B 671.7 -> 689.4, 1.7B 622.2 -> 648.1
# audio-s/s) and idle_spin_ms=20 over HTTP c=1 (RTF mean 0.04004 -> 0.03997). Before making them the defaults: the
# c=1 target's setting (HTTP, 1.7B) with spin20 alone again and with the whole stack (the tail chunks add four small
# codec calls beside the talker and shrink the final one from ~20 frames to 5), then offline c=1 off / the pair.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
for variant in spin20 spin20_tail5_rows16; do
  args=(--engine-arg idle_spin_ms=20)
  [ "$variant" = spin20_tail5_rows16 ] && args+=(--engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16)
  if serve_variant "c1_$variant" "${args[@]}"; then
    bench_http_at 1 "c1_$variant"
    stop_server "c1_$variant"
  fi
  pack_results
done
bench_1p7b_at 1 defaults
bench_1p7b_at 1 tail5_rows16 --engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16
pack_results
echo "done at ${SECONDS}s"
