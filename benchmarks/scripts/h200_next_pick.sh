#!/usr/bin/env bash
# Prepared in session 62 (which got no machine): one call (carry [".whl", ".device_tree"]), the script chosen by
# the card that came: on an H200 the target table with intake_while_waiting alternating (h200_next_targets.sh), on
# any other card the intake A/B (h200_next_intake.sh), which needs no H200.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash benchmarks/scripts/h200_next_targets.sh
fi
exec bash benchmarks/scripts/h200_next_intake.sh
