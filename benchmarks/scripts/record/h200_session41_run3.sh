#!/usr/bin/env bash
# Prepared in session 32-33, brought up to date in session 36, run as session 41 call 3 (commit 59542f5, as
# h200_next_run3.sh); carry [".whl", ".device_tree"]. (Its HTTP c=1 idle-spin A/B ran as session 35 call 2-3: no
# gain, cut from here.)
# The GPU across a 0.6B c=64 wave's end and the next wave's start (wave_end_timeline.py: from 8 frames before the
# end to 15 steps after the last request finished, so the new requests' prefill steps are in it) on today's
# defaults. Why: session 36 call 3's step trace (`step_trace_summary`'s prefill line) has the wave boundaries'
# prefill steps at 2.4 / 5.9 / 24.2 ms of wall time per 1,000 prompt tokens (min / median / max), e.g. 4,096 tokens
# in 13.2 ms and then 4,067 in 29.0 ms with a 24.9 ms host prefill phase: whether the host waits for the GPU there
# (a sync in the prefill path) or the GPU runs the prefill that long, and what the codec's final chunks overlap.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
wave_end_small defaults
pack_results
echo "done at ${SECONDS}s"
