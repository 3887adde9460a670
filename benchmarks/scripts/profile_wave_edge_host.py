"""Where the engine thread's time goes at a closed-loop wave's edge: cProfile of the prompt builds (`add_requests`)
and of the steps' prefill phase (`_run_prefills`: attach, the packed run's inputs, the replay's launch, the first c0
draw) while waves of requests arrive together, as in the 0.6B c=64 bench (session 47: ~0.7 ms of engine-thread time
a new request on the H100 / H200 hosts, in steps whose GPU waits were short: the wave edge is host-bound).

    python benchmarks/scripts/profile_wave_edge_host.py MODEL_DIR [waves] [frames] [KEY=VALUE ...]

KEY=VALUE: EngineConfig fields (e.g. kv_cache_bytes=2400000000 preload_text_rows=false codec_max_batch=16). On a GPU
its kernel launches and copies are what the host pays; on a CPU the tiny model's arithmetic runs there too. Prints,
per phase, the host ms a request (all waves but the first) and the top functions by own and cumulative time.
"""
import cProfile
import io
import pstats
import sys
import time

import torch

from voxflow.bench.workloads import load_prompts
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.engine_args import parse_engine_args
from voxflow.engine.request import SamplingOptions, SpeechRequest

ROWS = 64


def main() -> None:
    model = sys.argv[1]
    waves = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    frames = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    extra = parse_engine_args(sys.argv[4:])
    core = EngineCore.from_config(EngineConfig(model=model, device=device,
                                               dtype="bfloat16" if device == "cuda" else "float32",
                                               max_num_seqs=ROWS, **extra))
    texts = [p.text for p in load_prompts()]
    voice = core.model.describe()["voices"][0]
    profiles = {"builds": cProfile.Profile(), "prefill phase": cProfile.Profile()}
    seconds = dict.fromkeys(profiles, 0.0)

    def profiled(name, fn):
        def wrapper(*a, **k):
            if not profiled.on:
                return fn(*a, **k)
            t = time.perf_counter()
            profiles[name].enable()
            try:
                return fn(*a, **k)
            finally:
                profiles[name].disable()
                seconds[name] += time.perf_counter() - t
        return wrapper
    profiled.on = False
    add_requests = profiled("builds", core.add_requests)
    core._run_prefills = profiled("prefill phase", core._run_prefills)

    def wave(w: int) -> None:
        reqs = [SpeechRequest(text=f"{texts[(w * ROWS + i) % len(texts)]} ({w}.{i})", voice=voice,
                              request_id=f"w{w}-{i}", sampling=SamplingOptions(max_new_tokens=frames + 1,
                                                                                ignore_eos=True))
                for i in range(ROWS)]
        for i in range(0, ROWS, 16):           # arrivals in bursts, as a server's loop hands them over
            add_requests(reqs[i:i + 16])
        while core.has_work():
            core.step()
    for w in range(waves):
        profiled.on = w > 0                    # the first wave warms caches and first-use compiles
        wave(w)
    n = (waves - 1) * ROWS
    print(f"{model} on {device}, {waves - 1} measured waves of {ROWS} requests x {frames} frames")
    for name, prof in profiles.items():
        print(f"\n== {name}: {seconds[name] * 1e3 / max(n, 1):.3f} ms a request (host, profiled)")
        for order in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(order).print_stats(18)
            print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
