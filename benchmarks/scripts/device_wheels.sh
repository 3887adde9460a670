#!/usr/bin/env bash
# Wheels that the H200 device image lacks, for the `http` and `official` stages of h200_targets.sh, downloaded into
# .whl/ (git-ignored through .git/info/exclude; carried with `carry: [".whl"]`, ~10 MB), .whl-official/ and .whl-fast/
# (below).
# Installed there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site        (h200_targets.sh keeps it, ahead of nothing but the repo)
# The image already has numpy, torch, triton, anyio, click, h11, httpx, msgpack, einops, lazy-loader, numba,
# scikit-learn, accelerate, onnxruntime, torchaudio, prometheus-client (see the device KINDS.md package list).
# Learned the hard way (2026-12-01): fastapi >= 0.16x imports opentelemetry; pooch needs platformdirs; soundfile
# needs cffi. `check_device_wheels.sh` checks the serving set here, without device time.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info && grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
# serving: voxflow serve (FastAPI app in the API process, the engine in another process over ZeroMQ)
serve="fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
       typing-inspection==0.4.5 typing_extensions==4.16.0 opentelemetry-api==1.45.2 uvicorn==0.54.0
       python-multipart==0.0.34 pyzmq==27.3.0 websockets==17.4 sniffio==1.3.1 soundfile==0.14.0 cffi==2.1.1
       pycparser==3.12"
# the official qwen-tts 0.1.1 oracle (tools/bench_official.py) and its pinned transformers
official="qwen-tts==0.1.1 tokenizers==0.22.1 huggingface_hub==0.36.0 librosa==0.11.0
          audioread==3.1.0 soxr==1.1.0 pooch==1.9.0 platformdirs decorator==5.3.1"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d .whl $serve $official
# transformers 4.57.3 (12 MB; the official package pins it, the image has 5.x) apart in .whl-official/: the tracked
# tree plus .whl passed the device's 64 MiB carry limit in session 14. Carry [".whl", ".whl-official"] for the
# official / clone stages; h200_targets.sh installs it when it is there.
grep -qx '/.whl-official/' .git/info/exclude 2>/dev/null || echo '/.whl-official/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d .whl-official transformers==4.57.3
# uvicorn's httptools parser and uvloop (`voxflow serve --http httptools --loop uvloop`: options, not the defaults;
# 5 MB) apart in .whl-fast/, carried only by the calls that serve with them: the tracked tree (45 MiB in session 54)
# plus .whl must stay under the 64 MiB carry limit.
grep -qx '/.whl-fast/' .git/info/exclude 2>/dev/null || echo '/.whl-fast/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d .whl-fast uvloop==0.23.0 httptools==0.9.0
du -sh .whl .whl-official .whl-fast
