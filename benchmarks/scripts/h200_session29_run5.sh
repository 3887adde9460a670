#!/usr/bin/env bash
# Session 29 call 5; carry [".whl", ".device_tree"]. On the warm machine of call 4 (its /tmp/real-1.7b kept):
# 1.7B c=1 with the projected input tables off (call 4: on, every single-token step went 117 -> 137 us), i.e. the
# defaults this session lands: the fused first step, the grouped slot gathers, the one input copy.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
[ -f /tmp/real-1.7b/config.json ] || { real_checkpoint_bg; wait $CK; }
VOXFLOW_PROJECTED_TABLES=0 bench_1p7b_at 1 tables_off
echo "done at ${SECONDS}s"
