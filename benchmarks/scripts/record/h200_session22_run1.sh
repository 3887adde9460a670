#!/usr/bin/env bash
# Prepared at the end of session 21, run as session 22 call 1 (kept as that call's record).
# `bash benchmarks/scripts/stamp_tree.sh`
# first; carry [".whl", ".device_tree"]; one archive back (r.tgz). About 550 s:
#  0. first, alone, two GPU tests of code that has not run on a GPU yet: the codec warm-up test as rewritten after
#     the review (a second shape's warm-up after the largest graph reserves nothing new; static inputs outside the
#     pool, the pool made on the runner's device), and the engine with the text table in host memory, which now
#     also has the layers fused at construction (b09ba79) and the codec cast whole (7eab7ef, c7879f1); and the
#     codec on an SM partition (codec_sms, a CUDA green context) against the whole GPU, for h200_next_run2.sh;
#  1. probe_allocations.py, 0.6B (2.4 GB pool, codec calls of <= 16): session 21 call 3 had ~823 MiB reserved but
#     free in the default pool of the load's stream (~660 MiB of it the holes of the weights fused on first use, the
#     rest the codec's fp32 weights); both are fixed on CPU, expected: reserved after startup ~5.8 GiB (6,528 MiB in
#     call 3), side stream pool down from 874 MiB (the fused weights moved to the load's stream);
#  2. 0.6B c=64 (2.4 GB pool): its whole footprint (7.34 GiB in session 21 call 2) and throughput;
#  3. the engine and codec GPU test files (session 21 call 3 ran 14 of the engine file's before its time limit).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
gpu_tests 180 "tests/gpu/test_gpu_codec.py::test_warmup_runs_in_the_graphs_own_memory" \
  "tests/gpu/test_gpu_codec.py::test_codec_on_an_sm_partition_equals_the_whole_gpu" \
  "tests/gpu/test_gpu_engine.py::test_gpu_text_embedding_on_host_serves_the_reference"
cp $R/gpu_tests.txt $R/gpu_tests_first.txt
wait $CK6
probe_small_allocations
echo "  at ${SECONDS}s"
bench_small_traced kv2p4gb
gzip -f $R/steps_0p6b_*.jsonl
gpu_tests 300 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py
echo "done at ${SECONDS}s"
