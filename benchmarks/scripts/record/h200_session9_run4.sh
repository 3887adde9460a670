#!/usr/bin/env bash
# Session 9, call 4 (carry [".whl"]): the whole GPU suite with today's defaults (packed prefill on, the codec's
# matmuls in TF32 with its convolutions), the served codec's SNR against plain fp32, and what the TF32 linears do
# to the codec-bound c=256 (offline, fp32/TF32 codec: 721.9 audio-s/s in call 3) and to c=64 over HTTP.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots --device cuda"
python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b --variant custom_voice --size 1.7B | tail -1 &
ck=$!
timeout 270 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > $R/gpu_tests_all.txt 2>&1
tail -n 6 $R/gpu_tests_all.txt
wait $ck
timeout 60 python3 -m voxflow.tools.codec_snr --model /tmp/real-1.7b --dtype float32 --device cuda --frames 150 --tf32 \
  2>&1 | grep -v Warn | tail -2 > $R/codec_snr_tf32.txt
head -1 $R/codec_snr_tf32.txt
if [ $SECONDS -lt 420 ]; then
  timeout 110 python3 -m voxflow.bench $common --model /tmp/real-1.7b --label offline-tf32linears --concurrency 256 \
    --num-prompts 512 --num-warmups 8 --max-num-seqs 256 --output $R/h200_1p7b_offline_c256_fp32.json 2>&1 \
    | grep -v "^\s*$" | tail -2
fi
if [ $SECONDS -lt 440 ] && serve_variant default; then
  bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json
  stop_server default
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
