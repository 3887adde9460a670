#!/usr/bin/env bash
# Session 5, device run 1: all GPU tests, the code predictor's fused layer at one row, the step profile with and
# without the high-priority talker stream, then the 1.7B c=16 workload over HTTP.
set -uo pipefail
R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
timeout 170 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head
timeout 100 python3 benchmarks/scripts/tune_cp_layer.py --rows 1 --skip-sweep > $R/tune_cp_rows1.txt 2>&1
grep -iE "attn|layer step|per frame|predict" $R/tune_cp_rows1.txt | head -20
[ -d /tmp/real-1.7b ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1
timeout 110 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,16,64 --no-eager 2>&1 | grep -v Warn > $R/profile_prio.txt
timeout 50 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager talker_priority=false 2>&1 | grep -v Warn > $R/profile_noprio.txt
grep "per step" $R/profile_prio.txt $R/profile_noprio.txt
cd $OUT && tar czf res.tgz r && rm -rf r
