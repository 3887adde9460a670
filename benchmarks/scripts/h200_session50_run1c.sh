#!/usr/bin/env bash
# Session 50, the last call (258 s of device time left); carry [".whl", ".device_tree"]. ~40 s.
# Calls 2-3 found the talker's decode attention latency-bound (0.84 ms of a 0.6B c=64 step at 2.24 TB/s): its
# tensor-core variant's 158 registers a thread allow three programs an SM, so 64 rows x 8 KV heads (512 programs)
# run as 1.3 waves on 132 SMs. Capped at 128 registers (maxnreg; compile_check: 127, no spill) four fit: one wave.
# probe_kv_fp8.py --regs: bf16 with and without the cap, with 3 stages, fp8 capped at 168 (104 bytes of spill).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
timeout 90 python3 benchmarks/scripts/probe_kv_fp8.py 64 171 --regs 2>&1 | grep -v -i warn | tee $R/probe_kv_regs.txt
pack_results
echo "done at ${SECONDS}s"
