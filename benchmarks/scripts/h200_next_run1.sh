#!/usr/bin/env bash
# Prepared in session 50 for the next session's first call; carry [".whl", ".device_tree"]; rename when run. ~480 s.
# 1. The talker's decode attention is latency-bound (session 50, H100: 0.84 ms of a 0.6B c=64 step at 2.24 TB/s):
#    its tensor-core variant's 158 registers a thread allow three programs an SM, so 64 rows x 8 KV heads (512
#    programs) run as 1.3 waves on 132 SMs; capped at 128 (maxnreg; compile_check: 127, no spill) four fit, one
#    wave. probe_kv_fp8.py --regs (~10 s): bf16 with / without the cap, 3 stages, fp8 capped at 168. If the cap
#    wins: TC_MAXNREG in paged_decode_attention.py, its GPU tests, and the served A/B.
# 2. fp8 KV pages (kv_cache_dtype=fp8, opt-in; session 50: GPU tests pass, attention 0.838 -> 0.742 ms a step) served:
#    0.6B c=64 <= 8 GB offline, fp8 in a 1.4 GB pool (the first run: compiles) against bf16 in 2.4 GB.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
timeout 90 python3 benchmarks/scripts/probe_kv_fp8.py 64 171 --regs 2>&1 | grep -v -i warn | tee $R/probe_kv_regs.txt
pack_results
wait $CK6
bench_small_first fp8_0 --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000   # (compiles)
pack_results
bench_small_traced off_1
pack_results
bench_small_traced fp8_1 --engine-arg kv_cache_dtype=fp8 --engine-arg kv_cache_bytes=1400000000
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
