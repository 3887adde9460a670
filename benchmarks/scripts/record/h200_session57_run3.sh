#!/usr/bin/env bash
# Session 57 call 3, as it ran inline on the warm H100 (118 s): 0.6B c=64 over HTTP under the 8-chunk layout
# (chunk_ramp_factor 2 + codec_tail_chunk 10, the default since), with the upsample stages over rows
# (VOXFLOW_CODEC_UPSAMPLE_CL=1: f2r_*) and without (f2_3), alternating. Carry [".whl", ".device_tree"].
source benchmarks/scripts/device_lib.sh; device_setup /tmp/r >/dev/null 2>&1
(while sleep 15; do pack_results; done) &
A="--engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10"
export VOXFLOW_CODEC_UPSAMPLE_CL=1; http_small f2r_1 $A
unset VOXFLOW_CODEC_UPSAMPLE_CL; http_small f2_3 $A
export VOXFLOW_CODEC_UPSAMPLE_CL=1; http_small f2r_2 $A
grep -H "peak_gpu_memory_total" $R/health_*.json; pack_results; echo done $SECONDS
