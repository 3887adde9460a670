#!/usr/bin/env bash
# Session 19, call 3 (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]; one archive
# back, r.tgz). Did not run as its own call: call 4 (h200_session19_run4.sh) ran it. Offline c=256 (the
# best-concurrency target; session 15: 1,016.5 audio-s/s), an A/B on one machine:
# the engine's startup objects frozen out of the garbage collector's sight (the default since c1c2a2a, as the server
# does) against --no-gc-freeze (how every earlier offline run ran), each with a step trace (gc_ms a step). Call 1's
# c=256 profile spent 7.6 ms a step in collect_decode beyond its wait (session 17: 0.7).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
wait $CK
bench_offline freeze --engine-arg trace_steps=$R/steps_c256_freeze.jsonl
echo "  at ${SECONDS}s"
bench_offline nofreeze --no-gc-freeze --engine-arg trace_steps=$R/steps_c256_nofreeze.jsonl
gzip -f $R/steps_c256_*.jsonl
for f in $R/steps_c256_*.jsonl.gz; do
  echo "== $f"; python3 -m voxflow.tools.step_trace_summary "$f" | head -12
  python3 -c "import gzip,json,sys; g=[json.loads(l).get('gc_ms',0) for l in gzip.open(sys.argv[1])]; \
print('gc ms total', round(sum(g),1), 'max', max(g), 'steps > 5 ms', sum(x > 5 for x in g))" "$f"
done
echo "done at ${SECONDS}s"
