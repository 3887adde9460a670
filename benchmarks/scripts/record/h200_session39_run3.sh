#!/usr/bin/env bash
# Prepared in session 37 (no device was lent that session); carry [".whl", ".device_tree"]. Rename to
# h200_sessionNN_runK.sh when run. ~450 s.
# decode_before_prefill (EngineConfig; voxflow/engine/engine.py step()): a step that both decodes and prefills queues
# the running streams' decode first, so the GPU decodes while the host builds the prefill. Why: session 36 call 3's
# 0.6B c=64 trace has a wave's new prompts taking 0.35-1 ms of host time a chunk (11.9 ms for 31 chunks, 24.9 ms for
# 25) before the step's decode was launched, with 29-51 streams waiting in those steps. Same outputs (a CPU test
# holds the order and the codes). This call: 0.6B c=64 (<= 8 GB) off / on / off / on with step traces (the machine's
# noise is ~±2%: 684-715 for the same defaults), each way's wave end + next wave's prefill timeline
# (wave_end_timeline.py, which also answers h200_next_run3.sh: does the host wait for the GPU in the prefill
# path?), then 1.7B c=64 off / on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK6
bench_small_traced defaults
bench_small_traced decode_first --engine-arg decode_before_prefill=true
bench_small_traced defaults_again
bench_small_traced decode_first_again --engine-arg decode_before_prefill=true
summarize_steps "steps_0p6b_*.jsonl" 18
pack_results
wave_end_small defaults
wave_end_small decode_first decode_before_prefill=true
pack_results
wait $CK
bench_1p7b_at 64 c64_defaults
bench_1p7b_at 64 c64_decode_first --engine-arg decode_before_prefill=true
pack_results
echo "done at ${SECONDS}s"
