#!/usr/bin/env bash
# Session 10, call 3 (carry [".whl"]): this session's CPU-tested changes on the GPU, and two measurements to decide.
#  1. GPU tests: the engine (fp32 == CPU reference; new: 12 requests, decode bucket 16, above the skinny sizes,
#     where the decoder layers now leave their MLP residual add to the next norm), the paged attention kernels
#     (min_split_tokens);
#  2. tune_paged_decode.py: the device-side minimum split length of the paged decode attention (default 16 = one
#     tile, the behaviour so far);
#  3. tune_pdl.py at one row with VOXFLOW_PDL_PREFETCH=0 (PDL's launch overlap without the weight prefetch, which
#     made call 1's fused layer step slower);
#  4. profile_step c=1,64 with the defaults (call 2: c=64 9.23 ms before the fused residual adds) and with
#     RUNTIME_MIN_SPLIT_TOKENS=64 set in-process (no product knob);
#  5. HTTP c=64 with the defaults.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 240 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/gpu/test_gpu_engine.py \
  tests/gpu/test_gpu_paged_attention.py > $R/gpu_tests.txt 2>&1 &
tests=$!
timeout 120 python3 benchmarks/scripts/tune_paged_decode.py > $R/tune_paged_decode.txt 2>&1
grep -v Warn $R/tune_paged_decode.txt | tail -17
wait $tests; grep -E "^E |passed|failed" $R/gpu_tests.txt | tail -6
VOXFLOW_PDL_PREFETCH=0 timeout 90 python3 benchmarks/scripts/tune_pdl.py --rows 1 > $R/tune_pdl_noprefetch.txt 2>&1
grep -v Warn $R/tune_pdl_noprefetch.txt | tail -3
wait $ck
timeout 130 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64_default.txt
grep -E "per step|by stream" $R/profile_step_1_64_default.txt
if [ $SECONDS -lt 380 ]; then
  timeout 130 python3 -c "
import runpy, sys
import voxflow.kernels.paged_decode_attention as p
p.RUNTIME_MIN_SPLIT_TOKENS = 64
sys.argv = ['profile_step.py', '/tmp/real-1.7b', '1,64', '--no-eager']
runpy.run_path('benchmarks/scripts/profile_step.py', run_name='__main__')" 2>&1 | grep -v Warn > $R/profile_step_1_64_min64.txt
  grep -E "per step|by stream" $R/profile_step_1_64_min64.txt
fi
if [ $SECONDS -lt 470 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
