#!/usr/bin/env bash
# Session 63 call 3, on the H100 of call 1 while it was still warm: h200_session63_call1.sh (then named
# h200_next_intake.sh) without its GPU test, other runs. The command given to the device tool was
#   UNTIL=330 RUNS="j_5 e_7 j_6 e_8 j_7 e_9 j_8 e_10 j_9" timeout 400 bash -c 'sed "/^gpu_tests/d" benchmarks/scripts/h200_next_intake.sh > /tmp/ab.sh; bash /tmp/ab.sh' 2>&1 | grep -E "^\| c=64|wrote|preempt|done at" | tail -c 5000
# Runs that would have started after UNTIL (330 s) did not run.
set -uo pipefail
sed "/^gpu_tests/d" benchmarks/scripts/record/h200_session63_call1.sh > /tmp/ab.sh
UNTIL=330 RUNS="j_5 e_7 j_6 e_8 j_7 e_9 j_8 e_10 j_9" timeout 400 bash /tmp/ab.sh
