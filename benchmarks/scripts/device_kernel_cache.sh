#!/usr/bin/env bash
# Triton's kernel cache from one device call to the next (device_lib.sh's restore_kernel_cache / pack_kernel_cache
# say why): a call that compiled kernels sends the cache back as $OUT/triton_cache.tgz.aa, .ab, ...
#   bash benchmarks/scripts/device_kernel_cache.sh take FILES_AT   after that call: its parts into .triton_cache/
#                                                                   (ignored), replacing the ones before
#   then carry ".triton_cache" with ".whl" and ".device_tree" in the next call
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
case "${1:-}" in
  take)
    src=${2:?usage: $0 take FILES_AT}
    if ! ls "$src"/triton_cache.tgz.* > /dev/null 2>&1; then echo "no kernel cache in $src"; exit 0; fi
    # (whole before it replaces the old one: the parts must unpack)
    cat "$src"/triton_cache.tgz.* | gzip -t || { echo "the parts in $src do not unpack: kept the old cache" >&2; exit 1; }
    rm -rf .triton_cache && mkdir .triton_cache && cp "$src"/triton_cache.tgz.* .triton_cache/
    echo "kernel cache: $(du -sh .triton_cache | cut -f1) in .triton_cache" ;;
  *) echo "usage: $0 take FILES_AT" >&2; exit 2 ;;
esac
