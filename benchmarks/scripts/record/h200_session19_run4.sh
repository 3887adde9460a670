#!/usr/bin/env bash
# Session 19, call 4 (stamp_tree.sh first; carry [".whl", ".device_tree"]; one archive back). Call 2's 0.6B part
# again after its fix (set_per_process_memory_fraction needs a device index), then call 3's c=256 A/B
# (h200_session19_run3.sh, which did not run on its own).
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
small kv2p4gb --engine-arg kv_cache_bytes=2400000000
small reserve --engine-arg kv_reserve_frames=151
gzip -f $R/steps_0p6b_*.jsonl
wait $CK
if [ $SECONDS -lt 380 ]; then
  bench_offline freeze --engine-arg trace_steps=$R/steps_c256_freeze.jsonl
  echo "  at ${SECONDS}s"
fi
if [ $SECONDS -lt 480 ]; then
  bench_offline nofreeze --no-gc-freeze --engine-arg trace_steps=$R/steps_c256_nofreeze.jsonl
fi
gzip -f $R/steps_c256_*.jsonl
for f in $R/steps_c256_*.jsonl.gz; do
  echo "== $f"; python3 -m voxflow.tools.step_trace_summary "$f" | head -12
  python3 -c "import gzip,json,sys; g=[json.loads(l).get('gc_ms',0) for l in gzip.open(sys.argv[1])]; \
print('gc ms total', round(sum(g),1), 'max', max(g), 'steps > 5 ms', sum(x > 5 for x in g))" "$f"
done
echo "done at ${SECONDS}s"
