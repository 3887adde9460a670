#!/usr/bin/env bash
# Prepared in session 32 (its device time spent); carry [".whl", ".device_tree"]. Run as session 35 call 2 (the
# 0.6B "defaults again" run cut for time; call 1 had talker_gemm_sms make no difference, so its second script, the
# busy graphs on every step and with this pair, did not run).
# The A/B of two switches that are off until this has run, one machine:
# - `codec_tail_chunk=5` (session 32): a request's last <= 25 frames before its length limit go to the codec in
#   chunks of 5 as they come instead of one final ~20-frame chunk after the talker's last step. Why: in session 32
#   call 3's 0.6B c=64 trace every wave of 64 requests ends together (equal lengths, closed loop) and 64 final chunks
#   of 20-21 frames then drain for 46-57 ms with the talker idle and no new request admitted (the clients wait for
#   their final records): ~150 ms of a 3.2 s run over its three wave ends.
# - `codec_call_rows=16` (session 33): chunks due together go to the codec in calls of at most 16 requests (the
#   0.6B bench's codec_max_batch), and an idle engine waits only for the oldest call, so a wave's first 16 requests
#   retire (and their closed-loop clients' next requests prefill) while the codec decodes the other 48 final chunks.
# Order: 0.6B c=64 (the open target) off / tail5 / rows16 / both / off again; 1.7B c=64 off / tail5 / both; 1.7B
# c=1 off / tail5 (its final chunk becomes 5 frames, but four more small chunks run beside the talker: expect no
# change). HTTP c=1, the target's setting, is in h200_next_run3.sh.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK6
bench_small_traced defaults
pack_results
bench_small_traced tail5 --engine-arg codec_tail_chunk=5
pack_results
bench_small_traced rows16 --engine-arg codec_call_rows=16
pack_results
bench_small_traced tail5_rows16 --engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16
pack_results
wait $CK
bench_1p7b_at 64 c64_defaults
bench_1p7b_at 64 c64_tail5 --engine-arg codec_tail_chunk=5
bench_1p7b_at 64 c64_tail5_rows16 --engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16
pack_results
bench_1p7b_at 1 defaults
bench_1p7b_at 1 tail5 --engine-arg codec_tail_chunk=5
pack_results
echo "done at ${SECONDS}s"
