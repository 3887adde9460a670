#!/usr/bin/env bash
# Session 23 call 4. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree", ".whl-split"]
# (.whl-split: cuda-bindings 13.0.3 + cuda-pathfinder, NVIDIA's driver API bindings, which engine/sm_split.py needs).
# About 450 s. The talker on the SMs the codec leaves (VOXFLOW_TALKER_SMS=rest, engine/sm_split.py): one driver
# split into the codec's group and the rest, two green contexts, so a talker block never waits on an SM the codec
# holds. First its GPU tests (the two streams' SM sets from %smid, a graph captured on the rest, the engine against
# the CPU reference), then 0.6B c=64 (<= 8 GB configuration) on one machine: the default (codec on 64 SMs, talker
# on all 132) against the split with the codec on 64 / 48 / 80 SMs and the talker on the rest.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-split/*.whl 2>&1 | grep -v -i "warning" | tail -2
small_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_sm_split.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_with_the_talker_on_the_sms_the_codec_leaves_equals_cpu_reference"
echo "  at ${SECONDS}s"
wait $CK6
bench_small_traced auto
pack_results
VOXFLOW_TALKER_SMS=rest bench_small_traced rest64
pack_results
VOXFLOW_TALKER_SMS=rest bench_small_traced rest48 --engine-arg codec_sms=48
pack_results
VOXFLOW_TALKER_SMS=rest bench_small_traced rest80 --engine-arg codec_sms=80
echo "done at ${SECONDS}s"
