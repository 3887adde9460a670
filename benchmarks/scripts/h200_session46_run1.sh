#!/usr/bin/env bash
# Session 46 call 1 (prepared in session 45); carry [".whl", ".device_tree"]. ~260 s, in the order of
# what matters (the call may be cut).
# 1. 0.6B c=64 over HTTP on the defaults, one server, 640 prompts: the target row on an H200 (session 44's 741.1 was
#    an H100; session 45 measured the defaults offline on an H200 at 760.5 / 758.7).
# 2. A kernel timeline of 0.6B c=64 steps on the defaults (step_timeline.py): where a full step's 5.34 ms go on the
#    H200, kernel by kernel (the H100's, sessions 40-41, are the only ones since the code predictor's layers were
#    folded).
# 3. probe_gemm_layouts.py (built in session 44, never run): cuBLAS at the decode layers' 64- / 128-row GEMMs with the
#    weight stored [K, N], and with fp32 split-K reductions.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
http_small defaults
pack_results
# (added in session 46) each residual-unit convolution of a 16-stream 25-frame call in fp16 (the served dtype): ms
# and TFLOP/s by channel count, to see which stage of the waveform stack the codec's time goes to
timeout 60 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float16 > $R/conv_cost_fp16.txt 2>&1
cut -c1-200 $R/conv_cost_fp16.txt | head -12
pack_results
# (as session 40 call 2 recorded it on the H100: staggered arrivals so that the codec runs beside the talker)
timeout 100 python3 benchmarks/scripts/step_timeline.py record /tmp/real-0.6b 64 "$R/timeline_small_c64.json.gz" \
  --stagger codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v -i warn | tail -3
python3 benchmarks/scripts/step_timeline.py report "$R/timeline_small_c64.json.gz" --sequence \
  > "$R/timeline_small_c64.txt"
head -1 "$R/timeline_small_c64.txt"
pack_results
timeout 60 python3 benchmarks/scripts/probe_gemm_layouts.py > $R/probe_gemm_layouts.txt 2>&1
cut -c1-300 $R/probe_gemm_layouts.txt
echo "done at ${SECONDS}s"
