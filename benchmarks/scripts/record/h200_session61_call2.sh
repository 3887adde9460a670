#!/usr/bin/env bash
# Session 61 call 2 (an H100, warm; 278 s; prepared in session 60 as h200_next_suite_probe.sh; the suite was cut at
# ~97% by UNTIL, the probe's codec load stopped after its first window). carry [".whl", ".device_tree"].
# 1. The whole GPU suite at once (`pytest -n 4 tests/gpu`, ~200 s on session 54's H200) under today's defaults: the
#    code predictor's GEMMs on skinny_linear + PDL (since session 59) had only its own file run; new since: the
#    skinny heads' engine test, the split-K fixup's test. Until UNTIL (default 260 s).
# 2. probe_gemms_beside_codec.py (~60 s): a 64-row layer pass's GEMM chain with cuBLAS, skinny_linear + PDL, + the
#    split-K fixup on the N = 1024 GEMMs, and without PDL; alone and beside the codec. Until PROBE_UNTIL (330 s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
gpu_suite "${UNTIL:-260}"
pack_results
probe_gemms "${PROBE_UNTIL:-330}" 80 probe_gemms_beside_codec --rounds 2
echo "done at ${SECONDS}s"
