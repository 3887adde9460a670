#!/usr/bin/env bash
# Session 23 call 5. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 300 s.
# The GPU tests of the engine and the codec on the session's final code (that of session 22's last commit, 3c303b2:
# its last mends to the codec's SM setting ran on the CPU only, and test_gpu_engine / test_gpu_codec last ran whole
# in session 22 call 1, before them).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
gpu_tests 330 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py
echo "done at ${SECONDS}s"
