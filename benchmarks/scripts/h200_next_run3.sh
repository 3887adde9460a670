#!/usr/bin/env bash
# Prepared in session 32 for the next session's third call; carry [".whl", ".device_tree"]. Rename to
# h200_sessionNN_run3.sh when run.
# HTTP c=1 (the c=1 target's setting: session 32 RTF mean 0.0399 / 0.0400, ~1 ms inside the target) A/B on one
# machine: the defaults, then the engine process polling without sleeping for 20 ms after its last work
# (`idle_spin_ms`, off by default until this has run). Why: over HTTP the prompt build and the queue + prefill part
# read 0.5-0.7 ms longer each than offline (session 32 calls 3-4's TTFP splits: prepare 1.56-2.02 against 1.47,
# queue and prefill 1.72-2.19 against 1.52 ms) although the engine runs the same code; over HTTP the engine process
# sleeps in poll() between requests (the client's round trip), offline its thread hardly does. If the sleep is what
# costs, spinning removes it. Then the defaults again (drift).
# Session 33 added, at the end: the GPU across a 0.6B c=64 wave's end (wave_end_timeline.py), defaults and with
# codec_call_rows=16: whether the talker's kernels stall behind the codec's final chunks there (session 32 call 3's
# step 307 waited 44 ms for a 12-row decode beside 62 final chunks), and what the new requests' prefill overlaps.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
for variant in defaults spin20 defaults_again; do
  args=()
  [ "$variant" = spin20 ] && args=(--engine-arg idle_spin_ms=20)
  if serve_variant "c1_$variant" "${args[@]}"; then
    bench_http_at 1 "c1_$variant"
    stop_server "c1_$variant"
  fi
  pack_results
done
small_checkpoint_bg                 # (only now: its writer's CPU load stays out of the c=1 latencies above)
wait $CK6
wave_end_small defaults
wave_end_small rows16 codec_call_rows=16
pack_results
echo "done at ${SECONDS}s"
