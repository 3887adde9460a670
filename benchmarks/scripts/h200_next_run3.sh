#!/usr/bin/env bash
# Prepared in session 32-33; carry [".whl", ".device_tree"]. Rename to h200_sessionNN_runK.sh when run. (Its HTTP c=1
# idle-spin A/B ran as session 35 call 2-3: no gain, cut from here.)
# The GPU across a 0.6B c=64 wave's end (wave_end_timeline.py) with the session-35 defaults (tail chunks of 5, codec
# calls of 16) and with both off: whether the talker's kernels still stall behind the codec's final chunks there
# (session 32 call 3's step 307 waited 44 ms for a 12-row decode beside 62 final chunks), and what the new requests'
# prefill overlaps.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
wave_end_small defaults
wave_end_small off codec_tail_chunk=0 codec_call_rows=None
pack_results
echo "done at ${SECONDS}s"
