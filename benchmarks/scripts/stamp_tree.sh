#!/usr/bin/env bash
# Run here before a device call, then carry ".device_tree" with the rest: the lent GPU machine gets a copy of the
# working tree whose .git (if any) is stale, so `voxflow bench` there would record an older commit. The stamp holds
# this tree's HEAD and "dirty" when tracked files differ from it; device_lib.sh's device_setup exports it as
# VOXFLOW_GIT_COMMIT / VOXFLOW_GIT_DIRTY, which the bench's result records (voxflow/bench/report.py, git_info).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
git rev-parse HEAD > .device_tree
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then echo dirty >> .device_tree; fi
cat .device_tree
# What travels must stay under the device tool's 64 MiB (tracked files, on disk, plus the carried wheels; session 62
# was refused at ~71 MiB counted in disk blocks). The results are not needed there: move them aside for the call
# (`bash benchmarks/scripts/device_results_aside.sh hold`, then `restore` after the call).
tracked_kib=$(git ls-files -z | du -c --files0-from=- 2>/dev/null | tail -1 | cut -f1)
kib=$(( tracked_kib + $(du -s .whl 2>/dev/null | cut -f1) ))
if (( kib > 60 * 1024 )); then
  echo "stamp_tree: the tree and .whl take $((kib / 1024)) MiB on disk (limit 64 MiB): move benchmarks/results" \
       "aside (device_results_aside.sh hold)" >&2
fi
