#!/usr/bin/env bash
# Session 54 call 1 (prepared in session 53 as h200_next_run1.sh); carry [".whl", ".device_tree"].
# <= ~420 s (a fresh machine is fine: no model is built).
# The whole GPU suite at once (`pytest -n 4 tests/gpu`), last run whole in session 10 (309 tests; every session
# since ran the files its work touched): the current defaults, every kernel against its reference and the engine's
# graph / kernel path against the CPU reference, on the card. UNTIL bounds it (default 400 s; SIGINT then,
# so pytest still reports what ran).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
timeout -s INT -k 20 "${UNTIL:-400}" python3 -m pytest -q -rfEs -n 4 -p no:cacheprovider --durations=20 tests/gpu \
  > "$R/gpu_tests_all.txt" 2>&1
echo "pytest rc $?"
grep -E "passed|failed|error" "$R/gpu_tests_all.txt" | tail -3
grep -E "^(FAILED|ERROR)" "$R/gpu_tests_all.txt" | head -30
pack_results
echo "done at ${SECONDS}s"
