#!/usr/bin/env bash
# Session 51 call 1 (prepared in session 50, step 3 added); carry [".whl", ".device_tree"]. ~480 s.
# The talker's decode attention is latency-bound (session 50, H100: 0.84 ms of a 0.6B c=64 step at 2.24 TB/s): its
# tensor-core variant's 158 registers a thread allow three programs an SM, so 64 rows x 8 KV heads (512 programs)
# run as 1.3 waves on 132 SMs; capped at 128 (maxnreg; compile_check: 127, no spill) four fit, one wave.
# Its tile loop is not software-pipelined either (no cp.async in the PTX: each tile's loads wait in turn);
# tl.range(num_stages=2) pipelines it at 128 registers without spill (LOOP_STAGES, VOXFLOW_PAGED_DECODE_STAGES).
# 1. Their GPU tests (bit-equal to the default launch), then probe_kv_fp8.py --regs (~15 s): bf16 with / without the
#    cap, pipelined at 2 / 3 stages, fp8 (kv_cache_dtype) capped and pipelined.
# 2. Served, 0.6B c=64 <= 8 GB offline, alternating: VOXFLOW_PAGED_DECODE_STAGES=2 (edit to the probe's winner:
#    STAGES and / or MAXNREG) against the defaults. If it wins: the default in paged_decode_attention.py
#    (_TC_LOOP_STAGES / _TC_MAXNREG), the GPU tests under it, gpu_path's tables.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 120 tests/gpu/test_gpu_paged_attention.py -k "pipelined or fp8"
timeout 90 python3 benchmarks/scripts/probe_kv_fp8.py 64 171 --regs 2>&1 | grep -v -i warn | tee $R/probe_kv_regs.txt
pack_results
wait $CK6
bench_small_first off_0                                              # (compiles the kernels)
pack_results
VOXFLOW_PAGED_DECODE_STAGES=2 bench_small_traced piped_1
pack_results
bench_small_traced off_1
pack_results
VOXFLOW_PAGED_DECODE_STAGES=2 bench_small_traced piped_2
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
# 3. A wave's prefill (64 prompts of ~200 positions at once): every step's wall, then its kernels by GPU time.
timeout 100 python3 benchmarks/scripts/profile_wave_prefill.py /tmp/real-0.6b 64 codec_max_batch=16 \
  kv_cache_bytes=2400000000 2>&1 | grep -v -i warn > $R/profile_wave_prefill.txt; head -45 $R/profile_wave_prefill.txt
pack_results
echo "done at ${SECONDS}s"
