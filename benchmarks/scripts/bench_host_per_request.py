"""Host time the engine thread spends per request outside the model's forward passes, on the bundled bench prompts:
building the prompt (`prepare`, which includes the prefix-cache position keys), the position keys alone, and the
slot attach + detach of a prefill. Median of rounds over all prompts, ms a request; and the tensor operations an
attach + detach issues (each a kernel launch or a copy on a GPU, where the time per operation is much larger than
on a CPU). On a CPU device the embedding GEMMs of `prepare` are real work (on a GPU, asynchronous launches), so read
the position keys and attach rows for host overheads.

    python benchmarks/scripts/bench_host_per_request.py MODEL_DIR [rounds]
"""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.workloads import load_prompts
from voxflow.engine.request import SpeechRequest
from voxflow.models.qwen3_tts.generate import SynthesisRequest, prepare
from voxflow.models.qwen3_tts.position_keys import position_keys
from voxflow.models.registry import load_for_engine


def per_request_ms(fn, items, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for item in items:
            fn(item)
        times.append((time.perf_counter() - t) / len(items) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    plugin, _ = load_for_engine(sys.argv[1], device="cpu", dtype="float32", max_slots=4)
    voice = plugin.describe()["voices"][0]
    texts = [p.text for p in load_prompts()]
    requests = [SpeechRequest(text=t, voice=voice, request_id=str(i)) for i, t in enumerate(texts)]
    prompts = [prepare(plugin.model, SynthesisRequest(text=t, speaker=voice))[0] for t in texts]
    prepared = [plugin.prepare(r) for r in requests]

    def attach_detach(p):
        plugin.attach(0, p)
        plugin.detach(0)
        p.state.resume = None           # a fresh attach next round, not a resumed one

    print(f"{len(texts)} prompts, {statistics.mean(p.length for p in prompts):.1f} positions on average")
    print(f"prepare        {per_request_ms(plugin.prepare, requests, rounds):.3f} ms a request")
    print(f"position keys  {per_request_ms(position_keys, prompts, rounds):.3f} ms a request")
    print(f"attach+detach  {per_request_ms(attach_detach, prepared, rounds):.3f} ms a request")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for p in prepared[:10]:
            attach_detach(p)
    ops = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    print(f"attach+detach  {len(ops) / 10:.1f} top-level tensor operations a request")


if __name__ == "__main__":
    main()
