"""Host time of building a burst of requests' prompts: one `prepare` after another (the engine before batched
builds) against one `prepare_many` for the burst (EngineCore.add_requests), ms a request, median (and best) of
rounds; and the top-level tensor operations each issues a request (each a kernel launch or a copy on a GPU). The text
rows the Talker keeps per token id are on (as on a GPU, where they are the default), so a CPU run takes the GPU's
code path; its times are CPU times, informative only.

    python benchmarks/scripts/bench_prepare_batch.py MODEL_DIR [burst] [rounds] [device]
"""
import statistics
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.workloads import load_prompts
from voxflow.engine.request import SpeechRequest
from voxflow.models.registry import load_for_engine


def per_request_ms(fn, requests, rounds: int, sync) -> tuple[float, float]:
    """(median, best) over rounds: on a shared machine the best round is the steadier figure."""
    times = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        fn(requests)
        sync()
        times.append((time.perf_counter() - t) / len(requests) * 1e3)
    return statistics.median(times), min(times)


def ops_per_request(fn, requests) -> float:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(requests)
    ops = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    return len(ops) / len(requests)


def main() -> None:
    torch.set_num_threads(1)
    burst = int(sys.argv[2]) if len(sys.argv) > 2 else 56
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    device = sys.argv[4] if len(sys.argv) > 4 else ("cuda" if torch.cuda.is_available() else "cpu")
    plugin, _ = load_for_engine(sys.argv[1], device=device, dtype="bfloat16" if device == "cuda" else "float32",
                                max_slots=4)
    plugin.talker.keep_text_rows = True
    info = plugin.describe()
    kw = {}
    if info["task"] == "custom_voice":
        kw["voice"] = info["voices"][0]
    elif info["task"] == "voice_design":
        kw["instructions"] = "A calm, clear voice."
    else:                               # one clip for all (its x-vector is computed once and cached by the plugin)
        tone = 0.1 * np.sin(2 * np.pi * 220.0 * np.linspace(0.0, 1.0, info["sample_rate"], dtype=np.float32))
        kw.update(ref_audio=tone.astype("<f4").tobytes(), x_vector_only=True)
    texts = [p.text for p in load_prompts()]
    requests = [SpeechRequest(text=texts[i % len(texts)], request_id=str(i), **kw) for i in range(burst)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def one_by_one(reqs):
        return [plugin.prepare(r) for r in reqs]

    ways = {"one by one": one_by_one}
    if hasattr(plugin, "prepare_many"):
        ways["prepare_many"] = plugin.prepare_many
    for fn in ways.values():
        fn(requests)                    # warm: text rows, fixed rows, allocator
    print(f"{info['name']} on {device}, bursts of {burst}, median of {rounds} rounds")
    for name, fn in ways.items():
        median, best = per_request_ms(fn, requests, rounds, sync)
        print(f"{name:<13} {median:.3f} ms a request (best round {best:.3f}), "
              f"{ops_per_request(fn, requests):.1f} tensor ops a request")


if __name__ == "__main__":
    main()
