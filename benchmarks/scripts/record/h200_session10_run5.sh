#!/usr/bin/env bash
# Session 10, call 5 (carry [".whl"]): the whole GPU suite with this session's defaults (programmatic dependent
# launch on, without the prefetch; decoder layers leaving their MLP residual add to the next norm; first chunks of
# 5 frames above 16 streams), then, if the call's time allows, HTTP c=16 (8 waves) with them. The HTTP part runs
# under one overall timeout so the call stays inside the session's remaining device time.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 \
  > /dev/null 2>&1 &
ck=$!
timeout 230 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests_all.txt 2>&1
echo "suite rc=$? at ${SECONDS}s"; grep -cE "PASSED|passed" $R/gpu_tests_all.txt; grep -E "^E |FAILED|failed|error" $R/gpu_tests_all.txt | head -8
wait $ck
if [ $SECONDS -lt 280 ]; then
  export R
  timeout 110 bash -c 'source benchmarks/scripts/device_lib.sh
    if serve_variant default; then
      bench_http --label http-default --concurrency 16 --num-prompts 128 --num-warmups 4 \
        --output $R/h200_1p7b_http_c16_default.json
    fi
    stop_server default'
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
