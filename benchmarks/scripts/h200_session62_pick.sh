#!/usr/bin/env bash
# Session 62: one call, the script chosen by the card that came: on an H200 the target table (call 1), on any other
# card the intake_while_waiting A/B (call 2), which needs no H200.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash benchmarks/scripts/h200_session62_call1.sh
fi
exec bash benchmarks/scripts/h200_session62_call2.sh
