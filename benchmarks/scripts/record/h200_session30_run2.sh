#!/usr/bin/env bash
# Session 30, call 2. Carry [".whl", ".device_tree"].
# Call 1's probe: the code predictor's fused layers ran 133.5 us a step in a chain of their own, 110.2 with a
# projection GEMM in front (draw alone 136.1, draw + projection 117.8, as served). Is it where a PDL chain's
# programs land (the next kernel's programs start beside the previous one's, on whichever SMs have room)?
# 1. the probe with each step of `proj` and `layers` kernel by kernel, under the three PDL settings: the early
#    trigger (default), VOXFLOW_PDL_TRIGGER=exit (the next kernel launched when this one's programs have all
#    exited), PDL off;
# 2. the 1.7B c=1 step timeline and bench with the exit trigger (against call 1's defaults: 3.287 ms, 23.90 audio-s/s).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
probe() {
  echo "== $*" | tee -a $R/probe_cp_step_chain.txt
  env "$@" timeout 150 python3 benchmarks/scripts/probe_cp_step_chain.py --timeline proj,layers 2>&1 \
    | grep -v -i warn | tee -a $R/probe_cp_step_chain.txt
}
probe VOXFLOW_PDL_TRIGGER=early
probe VOXFLOW_PDL_TRIGGER=exit
probe VOXFLOW_PDL=0
echo "  at ${SECONDS}s"
pack_results
wait $CK
timeline_at /tmp/real-1.7b 1 1p7b_c1_exit VOXFLOW_PDL_TRIGGER=exit
(export VOXFLOW_PDL_TRIGGER=exit; bench_1p7b_at 1 exit_trigger)
echo "done at ${SECONDS}s"
