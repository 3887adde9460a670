#!/usr/bin/env bash
# Session 13, call 3 (carry [".whl"]): a measurement for the next session, no code change: the talker's paged decode
# attention at the served batch sizes (79 us a layer at 256 rows in call 2's profile): the heuristic's launch vs
# splits / tiles / warps (tune_paged_decode.py).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
timeout 200 python3 benchmarks/scripts/tune_paged_decode.py --rows 64,256 --contexts 64,128,256 2>&1 | grep -v Warn \
  > $R/tune_paged_decode.txt
cat $R/tune_paged_decode.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
