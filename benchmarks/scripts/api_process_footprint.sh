#!/usr/bin/env bash
# The API process's memory and whether it maps torch, with `voxflow serve` up (the engine is its child process).
#   bash benchmarks/scripts/api_process_footprint.sh MODEL [PORT] [SERVE_ARGS...]
set -uo pipefail
MODEL=$1; PORT=${2:-8161}; shift $(( $# >= 2 ? 2 : 1 ))
python -m voxflow.cli serve "$MODEL" --port "$PORT" "$@" > /tmp/api_process_footprint.log 2>&1 &
API=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && break; sleep 1; done
rss() { grep VmRSS "/proc/$1/status" | tr -s ' '; }
echo "API process $API: $(rss $API), libtorch mappings $(grep -c libtorch /proc/$API/maps)"
for c in $(pgrep -P $API); do
  echo "  child $c: $(rss $c), libtorch mappings $(grep -c libtorch /proc/$c/maps)"
done
kill $API; wait $API 2>/dev/null
