#!/usr/bin/env bash
# Session 19, call 5 (stamp_tree.sh first; carry [".whl", ".device_tree"]; one archive back). Call 4's 0.6B runs
# went out of memory under an 8e9-byte cap on the whole footprint: "this process has 8.86 GiB memory in use", of
# which 6.94 GiB was the allocator's share. So the <= 8 GB configuration is not that in total. Here without the cap,
# the footprint reported (engine stats: peak total = peak reservation + what lies outside the allocator):
#  1. the 2 GB pool (the configuration sessions 12-18 reported by its peak of tensors, 5.6-5.7 GiB);
#  2. the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (call 4's OOM found 0.87 GiB reserved but
#     unallocated);
#  3. a 2.4 GB pool (room for all 64 requests: no preemptions), with expandable segments.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
wait $CK6
small() {   # LABEL [ARGS]: bench_small_8gb without the cap, with a step trace; the footprint printed
  bench_small_8gb "$1" --engine-arg gpu_memory_limit_bytes=none --engine-arg trace_steps=$R/steps_0p6b_$1.jsonl "${@:2}"
  python3 -c "import gzip,json,sys; s=json.load(gzip.open(sys.argv[1]))['target']['engine']['stats']; \
print('  preemptions', s['preemptions'], '| GiB: peak total', *(round(s[k] / 2**30, 2) for k in \
('peak_gpu_memory_total_bytes',)), 'outside allocator', round(s['gpu_memory_outside_allocator_bytes'] / 2**30, 2), \
'peak reserved', round(s['peak_gpu_memory_reserved_bytes'] / 2**30, 2), 'peak tensors', \
round(s['peak_gpu_memory_bytes'] / 2**30, 2), '| startup outside', \
round(s['startup']['gpu_memory_outside_allocator_bytes'] / 2**30, 2))" "$R/h200_0p6b_offline_c64_$1.json.gz"
  echo "  at ${SECONDS}s"
}
small kv2gb
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
small kv2gb_expandable
small kv2p4gb_expandable --engine-arg kv_cache_bytes=2400000000
unset PYTORCH_CUDA_ALLOC_CONF
gzip -f $R/steps_0p6b_*.jsonl
echo "done at ${SECONDS}s"
