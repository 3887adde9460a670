#!/usr/bin/env bash
# Session 27 call 5 (tree bd3d134, 49 s); carry [".whl", ".device_tree"]. The weight prefetch it measured
# was slower and is removed (its code, tune_l2_prefetch.py included, is in bd3d134).
# Call 4's weight prefetch made a predict frame 1897 -> 5228 us with 2 programs a prefetch launch. Is that the
# prefetches' own time (2 SMs' copy engines for 31 MB a layer: the side branch, serial, becomes the critical path
# at the join) or the fork itself? tune_l2_prefetch.py over 2 / 16 / 64 programs, 1 / 2 ahead, and the branch with
# nothing to prefetch; then 1.7B c=1 off against the best setting if one beats off by > 2%.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
timeout 200 python3 benchmarks/scripts/tune_l2_prefetch.py --ahead 0,1,2 --programs 2,16,64 --dry 16 2>&1 \
  | grep -v Warn | tee $R/tune_l2_prefetch.txt | tail -9
pack_results
best=$(grep "^best:" $R/tune_l2_prefetch.txt)
if [ -n "$best" ]; then
  set -- $best
  wait $CK
  bench_1p7b_at 1 off
  VOXFLOW_L2_PREFETCH_PROGRAMS=$3 VOXFLOW_L2_PREFETCH=$5 bench_1p7b_at 1 "pf$5_p$3"
fi
echo "done at ${SECONDS}s"
