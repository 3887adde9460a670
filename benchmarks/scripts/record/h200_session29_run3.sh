#!/usr/bin/env bash
# Session 29 call 3; carry [".whl", ".device_tree"].
# (The L2 prefetch it measures was removed after this call, every size slower: its code, tests and
# tune_talker_prefetch.py are in d62e2eb.)
# The talker's gate|up weights partly prefetched into L2 during each one-row layer's attention (HBM idles there:
# call 1's timeline): GPU tests (same bits, spied; the fused first step's layer count), the layer-step grid of
# tune_talker_prefetch.py, then 1.7B c=1 with the grid's best against the default (bench + step timeline), and the
# 0.6B c=64 <= 8 GB run of this tree if time is left.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_l2_prefetch.py \
  "tests/gpu/test_gpu_cp_layer.py::test_predict_fused_layer_on_vs_off"
pack_results
timeout 150 python3 benchmarks/scripts/tune_talker_prefetch.py --mb 8,16,24,32 --programs 32,66,132 2>&1 \
  | grep -v -i warn | tee $R/tune_talker_prefetch.txt
best=$(python3 - "$R/tune_talker_prefetch.txt" <<'PY'
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("prefetch") and "same bits: True" in l]
off = [float(re.search(r"([\d.]+) us", l).group(1)) for l in open(sys.argv[1]) if l.startswith("off")]
best = min(rows, key=lambda l: float(re.search(r"([\d.]+) us", l).group(1)), default=None)
if best and off and float(re.search(r"([\d.]+) us", best).group(1)) < min(off) - 0.5:
    m = re.match(r"prefetch\s+([\d.]+) MiB,\s+(\d+) programs", best)
    print(m.group(1), m.group(2))
PY
)
echo "best: ${best:-none}"
pack_results
wait $CK
bench_1p7b_at 1 default
if [ -n "$best" ]; then
  set -- $best
  export VOXFLOW_ONE_ROW_PREFETCH_MB=$1 VOXFLOW_ONE_ROW_PREFETCH_PROGRAMS=$2
  bench_1p7b_at 1 prefetch
  timeout 120 python3 benchmarks/scripts/step_timeline.py record /tmp/real-1.7b 1 $R/timeline_1p7b_c1_prefetch.json.gz \
    2>&1 | grep -v -i warn
  python3 benchmarks/scripts/step_timeline.py report $R/timeline_1p7b_c1_prefetch.json.gz \
    > $R/timeline_1p7b_c1_prefetch.txt
  unset VOXFLOW_ONE_ROW_PREFETCH_MB VOXFLOW_ONE_ROW_PREFETCH_PROGRAMS
fi
pack_results
if [ $SECONDS -lt 380 ]; then
  small_checkpoint_bg
  wait $CK6
  bench_small_traced defaults
fi
echo "done at ${SECONDS}s"
