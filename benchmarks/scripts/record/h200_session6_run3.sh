#!/usr/bin/env bash
# Session 6, device run 3: tile configurations of the channels-last codec convolutions at a 64 x 25-frame call,
# the codec call with the winners, the codec GPU tests.
set -uo pipefail
R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 300 python3 benchmarks/scripts/tune_causal_conv.py 64 25 > $R/tune_causal_conv.txt 2>&1
grep -E "BEST|codec|Error|error" $R/tune_causal_conv.txt | head -40
sed -n '/^TUNED = {/,/^}/p' $R/tune_causal_conv.txt
timeout 120 python3 -m pytest -q -rs -n 2 -p no:cacheprovider tests/gpu/test_gpu_codec.py > $R/gpu_codec_tests.txt 2>&1
tail -2 $R/gpu_codec_tests.txt; grep -E "^(FAILED|ERROR)" $R/gpu_codec_tests.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
