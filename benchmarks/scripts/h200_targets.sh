#!/usr/bin/env bash
# The issue-6 target workloads on one H200, in stages that each fit one device call (<= 10 min):
#   STAGE=profile  1.7B step time with graphs at c=1 and c=64, kernels per step, GPU time by stage
#   STAGE=tests   all GPU tests (tests/gpu)
#   STAGE=http    1.7B through `voxflow serve` (streamed pcm over HTTP on loopback): c=1, c=16, c=64, with the
#                 engine's step trace (steps_http.jsonl.gz)
#   STAGE=stack   1.7B offline stacked comparison at c=1 and c=64: eager / graphs / graphs+kernels /
#                 + batched prefill / + chunk ramp / + the fp16 codec (everything on: codec_dtype=auto)
#   STAGE=small   0.6B c=64 with a 2 GB KV pool, the default codec and codec calls of <= 16 requests (the <= 8 GB
#                 target), then 1.7B at c=128 and c=256 (best concurrency)
#   STAGE=official  the official qwen-tts at 1.7B c=1 in the same run, then voxflow c=1 offline right after it
#   STAGE=codec    the streaming codec alone at 64 streams: time per call and top kernels, fp32 (TF32) and fp16
#   STAGE=prefill  a new request's first-packet split and the host time of its prefill step, alone and 16 at once
#   STAGE=clone   a Base model (voice clone, ICL with a 3 s reference) offline at c=1 and c=16
# The http and official stages need the wheels of benchmarks/scripts/device_wheels.sh (run it here, then
# `carry: [".whl"]`): the device image has no FastAPI/uvicorn/pydantic/pyzmq and no qwen-tts.
# Usage (repo root, on the GPU machine): STAGE=http OUT=results_dir bash benchmarks/scripts/h200_targets.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  # Wheels the device image lacks (serving stack, official qwen-tts): benchmarks/scripts/device_wheels.sh, carried
  # as .whl/. The official package's `sox` import (only its unreleased 25 Hz tokenizer uses it) is stubbed.
  # huggingface_hub 0.36 and tokenizers 0.22 go with the official stage's transformers 4.57.3 (.whl-official):
  # without it they would shadow the image's own transformers 5.x's, whose import then fails (the Base model's
  # codec encoder, tests/gpu/test_gpu_no_host_sync.py[base]: `is_offline_mode` from the hub in sessions 15-54 call 1,
  # then "tokenizers>=0.23.1,<0.24.0 is required" in session 54 call 2). voxflow takes tokenizers >= 0.19.
  wheels=$(ls .whl/*.whl)
  ls .whl-official/*.whl > /dev/null 2>&1 || wheels=$(ls .whl/*.whl | grep -v -e '/huggingface_hub-' -e '/tokenizers-')
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
    $(ls .whl-official/*.whl 2>/dev/null) \
    $(ls .whl-fast/*.whl 2>/dev/null)         # transformers 4.57.3 for the official stage; httptools + uvloop
  printf 'class Transformer:\n    pass\n' > /tmp/site/sox.py
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
OUT=${OUT:-/tmp/out}
STAGE=${STAGE:-tests}
mkdir -p "$OUT"
common="--dtype bfloat16 --max-new-tokens 151 --ignore-eos --no-progress --no-plots"
b() { python3 -m voxflow.bench $common "$@" 2>&1 | grep -v "^\s*$" | tail -4; }
ckpt() { [ -d "/tmp/real-$1" ] || python3 -m voxflow.tools.real_size_checkpoint --out "/tmp/real-$1" \
           --variant custom_voice --size "$2" | tail -1; }
case "$STAGE" in
profile)
  ckpt 1.7b 1.7B
  timeout ${PROFILE_TIMEOUT:-400} python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 2>&1 | grep -v Warning \
      | tee "$OUT/profile_1p7b.txt" ;;
codec)
  ckpt 1.7b 1.7B
  timeout ${CODEC_TIMEOUT:-200} python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 64 ${CODEC_SETTINGS:-fp32,fp16} 2>&1 \
      | grep -v Warning | tee "$OUT/profile_codec.txt" | grep "B=64" ;;
prefill)
  ckpt 1.7b 1.7B
  timeout ${PREFILL_TIMEOUT:-150} python3 benchmarks/scripts/profile_prefill.py /tmp/real-1.7b 16 2>&1 | grep -v Warning \
      | tee "$OUT/profile_prefill.txt" | grep -v "^ " | tail -12 ;;
tests)
  timeout ${TEST_TIMEOUT:-560} python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu > "$OUT/gpu_tests.txt" 2>&1   # -n: Triton compiles in parallel (xdist is on the device image)
  tail -n 30 "$OUT/gpu_tests.txt" ;;
http)
  ckpt 1.7b 1.7B
  python3 -m voxflow.cli serve /tmp/real-1.7b --device cuda --dtype bfloat16 --max-num-seqs 64 --port 8000 \
      --trace-steps "$OUT/steps_http.jsonl" > "$OUT/serve_log.txt" 2>&1 &
  for _ in $(seq 240); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; sleep 1; done
  b --base-url http://127.0.0.1:8000 --label http-full --concurrency 1 --num-prompts 3 --num-warmups 1 \
    --output "$OUT/h200_1p7b_http_c1.json.gz"
  b --base-url http://127.0.0.1:8000 --label http-full --concurrency 16 --num-prompts 64 --num-warmups 8 \
    --output "$OUT/h200_1p7b_http_c16.json.gz"
  # three waves of 64: the sustained rate, not one wave's ramp-up and tail
  b --base-url http://127.0.0.1:8000 --label http-full --concurrency 64 --num-prompts 192 --num-warmups 8 \
    --output "$OUT/h200_1p7b_http_c64.json.gz"
  curl -s http://127.0.0.1:8000/health > "$OUT/health_after_http.json"
  kill %1; wait; gzip -f "$OUT/steps_http.jsonl" ;;   # (a `pkill -f` on the command line would also match the calling shell)
stack)
  ckpt 1.7b 1.7B
  python3 -m voxflow.tools.codec_snr --model /tmp/real-1.7b --dtype float16 --device cuda --frames 150 2>&1 \
      | tail -3 | tee "$OUT/codec_snr_fp16.txt"
  # each step adds one piece; the codec in fp32 (TF32) until the last, which is the default (auto: fp16)
  for cfg in "eager:cuda_graphs=false kernels=false batch_prefill=false chunk_ramp=false codec_dtype=float32" \
             "graphs:kernels=false batch_prefill=false chunk_ramp=false codec_dtype=float32" \
             "graphs-kernels:batch_prefill=false chunk_ramp=false codec_dtype=float32" \
             "graphs-kernels-batchprefill:chunk_ramp=false codec_dtype=float32" "full-fp32codec:codec_dtype=float32" \
             "full:"; do
    label=${cfg%%:*}; args=""
    for kv in ${cfg#*:}; do args="$args --engine-arg $kv"; done
    levels="--concurrency 1,64 --num-prompts 16"; [ "$label" = eager ] && levels="--concurrency 64 --num-prompts 64"
    b --model /tmp/real-1.7b --device cuda --label "$label" --tag "stack=$label" $args $levels --num-warmups 4 \
      --max-num-seqs 64 --output "$OUT/h200_1p7b_stack_${label}.json.gz"
  done ;;
small)
  ckpt 0.6b 0.6B
  b --model /tmp/real-0.6b --device cuda --label small-8gb --engine-arg codec_max_batch=16 \
    --engine-arg kv_cache_bytes=2000000000 --concurrency 64 --num-prompts 192 --num-warmups 8 --max-num-seqs 64 \
    --output "$OUT/h200_0p6b_offline_c64.json.gz"
  ckpt 1.7b 1.7B
  b --model /tmp/real-1.7b --device cuda --label full --concurrency 128,256 --num-prompts 512 --num-warmups 8 \
    --max-num-seqs 256 --output "$OUT/h200_1p7b_offline_best.json.gz" ;;
clone)
  # Base (voice clone, ICL) 1.7B offline at c=1 and c=16 with the bench's generated 3 s reference clip and its
  # transcript; repeated requests share the reference prefix in the KV cache.
  [ -d /tmp/real-1.7b-base ] || python3 -m voxflow.tools.real_size_checkpoint --out /tmp/real-1.7b-base \
      --variant base --size 1.7B | tail -1
  b --model /tmp/real-1.7b-base --device cuda --label full-clone --task voice_clone --concurrency 1,16 \
    --num-prompts 32 --num-warmups 2 --max-num-seqs 64 --output "$OUT/h200_1p7b_clone_offline.json.gz" ;;
official)
  ckpt 1.7b 1.7B
  PYTHONPATH=/tmp/site:$PWD python3 tools/bench_official.py --model /tmp/real-1.7b --device cuda:0 \
      --dtype bfloat16 --num-prompts ${OFFICIAL_PROMPTS:-2} --num-warmups 1 --max-new-tokens 151 --ignore-eos --no-plots \
      --output "$OUT/h200_1p7b_official_c1.json.gz" 2>&1 | tail -4
  b --model /tmp/real-1.7b --device cuda --label full --concurrency 1 --num-prompts 3 --num-warmups 1 \
    --output "$OUT/h200_1p7b_offline_full_c1_same_run.json.gz" ;;
esac
