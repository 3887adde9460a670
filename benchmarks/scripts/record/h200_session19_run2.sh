#!/usr/bin/env bash
# Session 19, call 2 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive
# back, r.tgz). The GPU test of gpu_memory_limit_bytes, then today's defaults measured on one machine:
#  1. offline 0.6B c=64 in the <= 8 GB configuration, now capped at 8e9 bytes in total (gpu_memory_limit_bytes; the
#     total is reported), an A/B on one machine: the 2 GB pool (21 preemptions a run in sessions 17-18), the same with
#     kv_reserve_frames=151, a 2.4 GB pool (room for 64 requests of ~292 positions) (step traces);
#  2. HTTP c=64 with the defaults (session 18: 635.4 and 592.1 on two machines);
# The offline runs freeze the engine's startup objects out of the garbage collector's sight since this tree, as the
# server does (engine/gc_freeze.py; call 3 measures it at c=256).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 60 "tests/gpu/test_gpu_engine.py::test_gpu_memory_limit_caps_the_allocator_and_the_total_is_reported"
wait $CK6
small() {   # LABEL [ARGS]: bench_small_8gb (capped at 8e9 bytes in total) with a step trace
  bench_small_8gb "$1" --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl "${@:2}"
  python3 -c "import gzip,json,sys; s=json.load(gzip.open(sys.argv[1]))['target']['engine']['stats']; \
print('  preemptions', s['preemptions'], 'peak total / reserved / tensors GB', \
*(round(s[k] / 1e9, 2) for k in ('peak_gpu_memory_total_bytes', 'peak_gpu_memory_reserved_bytes', \
'peak_gpu_memory_bytes')))" "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}
small kv2gb
small reserve --engine-arg kv_reserve_frames=151
small kv2p4gb --engine-arg kv_cache_bytes=2400000000
gzip -f $R/steps_0p6b_*.jsonl
wait $CK
if serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json.gz
fi
stop_server default
echo "done at ${SECONDS}s"
