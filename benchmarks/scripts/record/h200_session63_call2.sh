#!/usr/bin/env bash
# Session 63 call 2, on the H100 of call 1 while it was still warm: h200_session63_call1.sh (then named
# h200_next_intake.sh) without its GPU test, other runs. The command given to the device tool was
#   UNTIL=400 RUNS="e_3 i_3 j_2 e_4 i_4 j_3 e_5 i_5 j_4 e_6 i_6" timeout 500 bash -c 'sed "/^gpu_tests/d" benchmarks/scripts/h200_next_intake.sh > /tmp/ab.sh; bash /tmp/ab.sh' 2>&1 | tail -c 6000
# Runs that would have started after UNTIL (400 s) did not run.
set -uo pipefail
sed "/^gpu_tests/d" benchmarks/scripts/record/h200_session63_call1.sh > /tmp/ab.sh
UNTIL=400 RUNS="e_3 i_3 j_2 e_4 i_4 j_3 e_5 i_5 j_4 e_6 i_6" timeout 500 bash /tmp/ab.sh
