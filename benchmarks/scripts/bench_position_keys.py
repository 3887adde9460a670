"""Host time of a burst's prefix-cache keys (qwen3_tts/position_keys.py), us a prompt: each prompt keyed alone
(`position_keys`) and the burst keyed together (`position_keys_many`, where the tree has it). The prompts are the
bench workload's, built once by the model's own prepare path; best and median of rounds.

    python benchmarks/scripts/bench_position_keys.py MODEL_DIR [burst] [rounds]
"""
import statistics
import sys
import time

import torch

from voxflow.bench.workloads import load_prompts
from voxflow.engine.request import SpeechRequest
from voxflow.models.qwen3_tts import position_keys as pk
from voxflow.models.qwen3_tts.generate import prepare_many
from voxflow.models.registry import load_for_engine


def main() -> None:
    torch.set_num_threads(1)
    burst = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    plugin, _ = load_for_engine(sys.argv[1], device="cpu", dtype="float32", max_slots=4)
    info = plugin.describe()
    kw = {"voice": info["voices"][0]} if info["task"] == "custom_voice" else {"instructions": "A calm voice."}
    texts = [p.text for p in load_prompts()]
    reqs = [SpeechRequest(text=texts[i % len(texts)], request_id=str(i), **kw) for i in range(burst)]
    items = [(built[0], None, 0) for built in prepare_many(plugin.model, [plugin._synthesis_request(r)
                                                                           for r in reqs])]
    ways = {"alone": lambda: [pk.position_keys(*item) for item in items]}
    if hasattr(pk, "position_keys_many"):
        ways["burst"] = lambda: pk.position_keys_many(items)
    positions = sum(item[0].length for item in items) / burst
    print(f"{info['name']}: bursts of {burst} prompts ({positions:.0f} positions a prompt), {rounds} rounds")
    for name, fn in ways.items():
        fn()
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) / burst * 1e6)
        print(f"{name:<6} {min(times):6.1f} us a prompt (best), {statistics.median(times):6.1f} (median)")


if __name__ == "__main__":
    main()
