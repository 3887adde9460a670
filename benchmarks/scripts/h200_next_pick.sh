#!/usr/bin/env bash
# Prepared in sessions 62-64: one call (carry [".whl", ".device_tree", ".triton_cache"]; the last one once a call
# has sent Triton's kernel cache back: device_kernel_cache.sh), the script chosen by the card that came: on
# an H200 the target table with intake + emit while waiting alternating (h200_next_targets.sh), on any other card
# their A/B again with the codec's SM share (h200_next_h100.sh), which needs no H200.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash benchmarks/scripts/h200_next_targets.sh
fi
exec bash benchmarks/scripts/h200_next_h100.sh
