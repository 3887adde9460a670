#!/usr/bin/env bash
# The device tool copies the working tree (tracked files, counted in disk blocks, plus carried paths) only under
# 64 MiB; the tree and .whl passed that in session 62 (~70 MiB), and the results are not needed there. `hold`
# prints what would travel with .whl, .device_tree and .triton_cache (device_kernel_cache.sh).
#   bash benchmarks/scripts/device_results_aside.sh hold      before a call: stamp the tree, move the results out
#   bash benchmarks/scripts/device_results_aside.sh restore   after it (before any commit): move them back
# Out of the checkout, so that neither the copy nor a `git add -A` meanwhile sees them (git status shows them
# deleted until restored).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
aside="${VOXFLOW_RESULTS_ASIDE:-/tmp/voxflow_results_aside}"
case "${1:-}" in
  hold)
    bash benchmarks/scripts/stamp_tree.sh 2>/dev/null
    if [ -e "$aside" ]; then echo "$aside exists: restore (or remove) it first" >&2; exit 1; fi
    mv benchmarks/results "$aside"
    echo "results moved to $aside"
    # what travels (tracked files in disk blocks, and the carried folders that are here), against the 64 MiB limit
    # (du skips the tracked results just moved out, and the carried folders not here, with a complaint)
    travel=$( (git ls-files -z | du -c --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
    carried=$( (du -sc .whl .device_tree .triton_cache 2>/dev/null || true) | tail -1 | cut -f1)
    echo "to travel: $(( (travel + carried) / 1024 )) MiB (tracked $(( travel / 1024 )), carried $(( carried / 1024 )))" ;;
  restore)
    if [ ! -d "$aside" ]; then echo "nothing held at $aside" >&2; exit 1; fi
    if [ -e benchmarks/results ]; then
      # results written meanwhile (a call's files unpacked): merged into the held tree, then put back
      cp -a benchmarks/results/. "$aside"/ && rm -rf benchmarks/results
    fi
    mv "$aside" benchmarks/results
    echo "results back" ;;
  *) echo "usage: $0 hold|restore" >&2; exit 2 ;;
esac
