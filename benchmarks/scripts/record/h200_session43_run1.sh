#!/usr/bin/env bash
# Prepared in session 42 (after its device time), run as session 43 call 1; carry [".whl", ".device_tree"].
# ~500 s.
# 1. probe_fp8_gemm.py (~30 s, measures only): the code predictor's four GEMM shapes at 64 rows, bf16 F.linear
#    against torch._scaled_mm with e4m3 operands (rowwise scales), and the activation quantization's cost: whether
#    fp8 weights could shorten the 64-row GEMMs that are ~60% of a 0.6B c=64 step (Triton GEMMs lost to cuBLAS at
#    these sizes in sessions 12, 13, 25 and 42).
# 2. The 0.6B c=64 target over HTTP (serve_small: 2.4 GB pool, no preloaded text rows, 7.30 GiB whole footprint in
#    session 42), one server each: defaults, `intake_while_waiting` 4, `add_seconds_per_step` 4 ms, defaults again.
#    Why: in session 42's HTTP runs the engine thread spent ~0.6-0.7 ms a request building prompts, in rounds of
#    20-45 arrivals (15-29 ms each, 69-85 ms a run), while at most one step was queued on the GPU; and a
#    request's row idled ~65 ms a cycle between its talker's end and the next request's prefill (final chunk,
#    relay, client, intake, prepare).
#    - `intake_while_waiting` 4 (built after session 42's calls, engine.py `_take_arrivals_while`): the host builds
#      the arrivals' prompts while it waits for a decode step's results (~4.4 ms a step spent blocked now), so a
#      build delays no launch and a request is taken up within the step it arrives in (its `intake`, 8.6 ms of its
#      first-audio split in session 42, was mostly the wait for the step to end). Adopt (default 4: ~2.5 ms a unit
#      at ~0.6 ms a build) if HTTP audio-s/s rises beyond the defaults' two runs; the step trace's `intake` column
#      says how much it took. Its GPU test first: tests/gpu/test_gpu_engine.py -k intake (added below).
#    - Pacing (`add_seconds_per_step`, off since session 7, where it cost 1.7B c=64 446 -> 407 audio-s/s with a
#      padded prefill and ~2x longer steps): a few builds, a step, more builds.
#    Every 0.6B run here has 640 prompts (device_lib.sh's SMALL_PROMPTS): the benchmarking rules' >= 10 x c for a
#    closed loop; sessions up to 42 ran 192 (3 x c), where the runs' first arrivals and last tails weighed a third of
#    each client's cycles. Not comparable with the 192-prompt figures (expect them a little higher).
# 3. Offline, the same machine: pacing off / 4 ms (the offline waves' 64 arrivals: one 32 ms build, then the prefill).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
timeout 90 python3 benchmarks/scripts/probe_fp8_gemm.py 64 2>&1 | grep -v -i warn | tee $R/probe_fp8_gemm.txt | tail -6
echo "  at ${SECONDS}s"
pack_results
gpu_tests 120 tests/gpu/test_gpu_engine.py -k intake
wait $CK6
# one server each: defaults, intake while waiting (4 a unit), pacing at 4 ms, defaults again (their spread
# brackets the others)
for v in defaults:add_seconds_per_step=none intake4:intake_while_waiting=4 paced4:add_seconds_per_step=0.004 \
         defaults_again:add_seconds_per_step=none; do
  name=${v%%:*}; arg=${v#*:}
  if serve_small $name --engine-arg $arg; then
    bench_http_small $name
    stop_server $name
  fi
  pack_results
done
grep -h "^| c=" $R/h200_0p6b_http_c64_*.md
bench_small_traced offline
bench_small_traced offline_paced4 --engine-arg add_seconds_per_step=0.004
grep -h "^| c=" $R/h200_0p6b_offline_c64_*.md
# 4. Where a prompt build's ~0.6 ms goes on this host (0.15 ms a request for the tiny model on a CPU): cProfile of the
#    builds (slows them; throughput of this run is not comparable), steps_0p6b_profiled.jsonl.prepare.pstats.
bench_small_traced profiled --engine-arg trace_profile_prepare=true
python3 -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(25)" \
  $R/steps_0p6b_profiled.jsonl.prepare.pstats > $R/prepare_profile.txt 2>&1
head -40 $R/prepare_profile.txt | tail -30
summarize_steps "steps_*" 16
echo "done at ${SECONDS}s"
