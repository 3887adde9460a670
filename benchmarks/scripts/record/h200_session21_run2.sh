#!/usr/bin/env bash
# Session 21 call 2. `bash benchmarks/scripts/stamp_tree.sh` first; `git archive d7d5e5a voxflow -o .old_voxflow.tar`
# (call 1's tree, for the A/B); carry [".whl", ".device_tree", ".old_voxflow.tar"]. About 500 s:
#  0. the new GPU tests, alone: the codec warm-ups in the graphs' own pool; the text embedding table in host memory;
#  1. probe_allocations.py, 0.6B (2.4 GB pool, codec calls of <= 16), now with the peak reservation: the weights
#     built in their dtype and loaded in place, the codec warm-ups in the graphs' pool;
#  2. 0.6B c=64 (2.4 GB pool): this tree; this tree with the talker on a highest-priority stream; call 1's tree
#     (d7d5e5a) in the same call; this tree with the text embedding table in host memory (text_embedding_on_host);
#  3. the engine and codec GPU test files (the load and the codec pool changed under them).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
gpu_tests 150 "tests/gpu/test_gpu_codec.py::test_warmup_runs_in_the_graphs_own_memory" \
  "tests/gpu/test_gpu_engine.py::test_gpu_text_embedding_on_host_serves_the_reference"
cp $R/gpu_tests.txt $R/gpu_tests_first.txt
wait $CK6
python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 kv_cache_bytes=2400000000 codec_max_batch=16 \
  2>&1 | grep -v Warning | tee $R/probe_allocations.txt | grep -A9 "^=="
echo "  at ${SECONDS}s"
bench_small_8gb kv2p4gb --engine-arg kv_cache_bytes=2400000000
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb.json.gz"
bench_small_8gb kv2p4gb_prio --engine-arg kv_cache_bytes=2400000000 --engine-arg talker_high_priority=true
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb_prio.json.gz"
mkdir -p /tmp/old && tar -xf .old_voxflow.tar -C /tmp/old
(cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/site bench_small_8gb kv2p4gb_d7d5e5a --engine-arg kv_cache_bytes=2400000000)
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb_d7d5e5a.json.gz"
bench_small_8gb kv2p4gb_host_table --engine-arg kv_cache_bytes=2400000000 --engine-arg text_embedding_on_host=true
print_footprint "$R/h200_0p6b_offline_c64_kv2p4gb_host_table.json.gz"
echo "  at ${SECONDS}s"
gpu_tests $((570 - SECONDS)) tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_engine.py
echo "done at ${SECONDS}s"
