#!/usr/bin/env bash
# After a device call: its files into the results tree, in one step.
#   bash benchmarks/scripts/device_take_call.sh FILES_AT DEST
#     FILES_AT  the call's files_at folder (r.tgz: the packed results folder; triton_cache.tgz.*: Triton's cache)
#     DEST      e.g. benchmarks/results/h100/2026-12-08-session65/call1 (created; must not hold files yet)
# It puts the results held aside for the call back (device_results_aside.sh restore, when they are held), takes
# the kernel cache into .triton_cache (device_kernel_cache.sh take), unpacks r.tgz's folder into DEST, and prints
# what to read first: the results table of DEST's bench results, the 0.6B A/B table (ab_0p6b_c64.md, bench ab),
# the GPU tests' verdict, the card and the tree that ran.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
src=${1:?usage: $0 FILES_AT DEST}
dest=${2:?usage: $0 FILES_AT DEST}
[ -f "$src/r.tgz" ] || { echo "no r.tgz in $src: nothing to take" >&2; exit 1; }
if [ -d "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
  echo "$dest already holds files: pick another call folder" >&2; exit 1
fi
if [ -d "${VOXFLOW_RESULTS_ASIDE:-/tmp/voxflow_results_aside}" ]; then
  bash benchmarks/scripts/device_results_aside.sh restore
fi
bash benchmarks/scripts/device_kernel_cache.sh take "$src"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$src/r.tgz" -C "$tmp"
inner=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -1)      # the packed folder (r/ in device_lib.sh)
[ -n "$inner" ] || { echo "r.tgz holds no folder" >&2; exit 1; }
mkdir -p "$dest"
cp -a "$inner"/. "$dest"/
echo "== $(find "$dest" -type f | wc -l) files in $dest"
for f in tree.txt gpu.txt; do [ -f "$dest/$f" ] && echo "$f: $(head -1 "$dest/$f")"; done
"${PYTHON:-python3}" benchmarks/scripts/results_table.py "$dest"
if [ -f "$dest/ab_0p6b_c64.md" ]; then echo; cat "$dest/ab_0p6b_c64.md"; fi
if [ -f "$dest/gpu_tests.txt" ]; then echo; grep -E "passed|failed|error" "$dest/gpu_tests.txt" | tail -3; fi
