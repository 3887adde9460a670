#!/usr/bin/env bash
# Session 35 call 2; carry [".whl", ".device_tree"]. Session 32's prepared A/Bs (h200_next_run.sh, h200_next_run3.sh)
# cut to fit one call, after call 1 found talker_gemm_sms no help (its follow-up script did not run):
# - `codec_tail_chunk=5` (session 32): a request's last <= 25 frames before its length limit go to the codec in
#   chunks of 5 as they come instead of one final ~20-frame chunk after the talker's last step. Why: every 0.6B c=64
#   wave (64 equal-length requests, closed loop) ends with ~75 ms of final chunks draining with the talker idle
#   (call 1's trace, steps 306 and 464).
# - `codec_call_rows=16` (session 33): chunks due together go to the codec in calls of at most 16 requests, and an
#   idle engine waits only for the oldest call, so a wave's first 16 requests retire (and their clients' next
#   requests prefill) while the codec decodes the other final chunks.
# - `idle_spin_ms=20` (session 32): over HTTP the engine process polls without sleeping for 20 ms after its last
#   work. Why: HTTP c=1's prompt build and queue + prefill read 0.5-0.7 ms longer each than offline, and the 1.7B c=1
#   RTF target (<= 0.04) is met by ~1 ms.
# - a kernel timeline of the 0.6B c=64 step in steady state (arrivals staggered, so codec calls run beside steps),
#   whose report now splits each kernel's charge alone / beside the codec's kernels (step_timeline.py `beside`):
#   call 1's probe saw ~3-4 us more per GEMM beside a load whatever its grid; if the step's other kernels pay the
#   same fixed price, fewer kernels is the lever.
# Order: 0.6B c=64 off / tail5 / rows16 / both; the 0.6B timeline; HTTP 1.7B c=1 off / spin20; 1.7B c=64 off / both.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
wait $CK6
bench_small_traced defaults
bench_small_traced tail5 --engine-arg codec_tail_chunk=5
pack_results
bench_small_traced rows16 --engine-arg codec_call_rows=16
bench_small_traced tail5_rows16 --engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
timeout 150 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 "$R/timeline_small_c64_stagger.json.gz" \
  --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v -i warn | tail -1
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64_stagger.json.gz" \
  > "$R/timeline_small_c64_stagger.txt"
sed -n '/^beside other/,+6p' "$R/timeline_small_c64_stagger.txt"
echo "  at ${SECONDS}s"
pack_results
wait $CK
for variant in defaults spin20; do
  args=()
  [ "$variant" = spin20 ] && args=(--engine-arg idle_spin_ms=20)
  if serve_variant "c1_$variant" "${args[@]}"; then
    bench_http_at 1 "c1_$variant"
    stop_server "c1_$variant"
  fi
  pack_results
done
bench_1p7b_at 64 c64_defaults
bench_1p7b_at 64 c64_tail5_rows16 --engine-arg codec_tail_chunk=5 --engine-arg codec_call_rows=16
pack_results
echo "done at ${SECONDS}s"
