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
