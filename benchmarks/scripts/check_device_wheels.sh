#!/usr/bin/env bash
# Checks, on this machine and without device time, that the wheels of device_wheels.sh are enough for the `http`
# stage of h200_targets.sh: a clean venv holding only what the device image has of voxflow's needs (torch and the
# base packages below, from its KINDS.md list), the serving wheels' packages at the same versions on top
# (--target, as on the device), then `voxflow serve` on a tiny checkpoint and `voxflow bench --base-url` against it.
# (This machine's Python may differ from the device's 3.12, so the same versions are installed from the index
# rather than the cp312 wheels themselves.)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-/tmp/voxflow-devsim}
SITE=$VENV/site
PORT=${PORT:-8011}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0 numpy safetensors tokenizers huggingface-hub anyio click h11 httpx msgpack \
    prometheus-client tqdm typing-extensions pyyaml requests filelock fsspec packaging regex annotated-doc
# the serving part of device_wheels.sh, same pins
serve=$(sed -n '/^serve="/,/"$/p' benchmarks/scripts/device_wheels.sh | tr -d '"' | sed 's/^serve=//')
"$VENV/bin/pip" install -q --no-deps --target "$SITE" $serve transformers==4.57.3 tokenizers==0.22.1 huggingface_hub==0.36.0
"$VENV/bin/python" -m voxflow.tools.tiny_checkpoint --out "$VENV/tiny" --variants custom_voice > /dev/null
export PYTHONPATH=$PWD:$SITE
"$VENV/bin/python" -m voxflow.cli serve "$VENV/tiny/custom_voice" --device cpu --dtype float32 --port "$PORT" \
    > "$VENV/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && break; sleep 1; done
"$VENV/bin/python" -m voxflow.bench --base-url "http://127.0.0.1:$PORT" --concurrency 1 --num-prompts 2 \
    --num-warmups 0 --max-new-tokens 6 --ignore-eos --no-progress --no-plots --output "$VENV/bench.json" | tail -3
echo "the serving wheels are enough: voxflow serve + voxflow bench --base-url ran (log: $VENV/serve.log)"
