#!/usr/bin/env bash
# Session 20 call 1 (prepared at the end of session 19, the probe added in session 20).
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive back (r.tgz). About 550 s:
#  1. GPU tests: the memory cap with the per-stage record of memory outside the allocator (not yet run on a GPU);
#  1b. probe_outside_memory.py: the memory outside the allocator after the context, cuBLAS, cuDNN, each startup stage,
#     a reset of the stack limit (local memory), served steps and the engine's deletion (0.6B, the 2.4 GB pool);
#  2. 0.6B c=64: where its ~2 GiB outside the allocator comes from (the startup stages, printed), with the 2.4 GB pool
#     (no preemptions: 645.6 in session 19), then the same with codec calls of <= 32 (a wave's 64 chunks in two
#     calls, not four);
#  3. HTTP c=64 with the defaults, the machine's clocks and host recorded (machine.txt).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 60 "tests/gpu/test_gpu_engine.py::test_gpu_memory_limit_caps_the_allocator_and_the_total_is_reported"
wait $CK6
python3 benchmarks/scripts/probe_outside_memory.py /tmp/real-0.6b 64 kv_cache_bytes=2400000000 codec_max_batch=16 \
  2>&1 | grep -v Warning | tee $R/probe_outside_memory.txt
echo "  at ${SECONDS}s"
small() {   # LABEL [ARGS]: bench_small_8gb with a 2.4 GB pool and a step trace; the footprint by startup stage
  bench_small_8gb "$1" --engine-arg kv_cache_bytes=2400000000 --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl "${@:2}"
  print_footprint "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}
small kv2p4gb
small kv2p4gb_codec32 --engine-arg codec_max_batch=32
gzip -f $R/steps_0p6b_*.jsonl
wait $CK
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "done at ${SECONDS}s"
