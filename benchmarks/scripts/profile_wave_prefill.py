"""Where a wave's prefill goes on the GPU: the closed-loop bench's waves end together and the next 64 prompts
(~186 positions each, ~11.9k positions) prefill in ~3 steps of the 4,096-position budget, every row idle
meanwhile. In session 49's 0.6B c=64 runs those steps cost +320 to +405 ms a run over full steps (~4% of it);
the GEMMs' FLOPs alone would take ~5 ms a 4,096-position step on an H100.

Per wave (64 requests of the bundled prompts, texts no request sent before, 3 frames each): every step's wall
(synchronized) with its prefill positions and decode rows; then one more wave under torch.profiler: the kernels of
its steps by total GPU time (CUPTI names the kernels inside graphs one by one).

    python benchmarks/scripts/profile_wave_prefill.py MODEL_DIR [ROWS] [KEY=VALUE engine args]
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from voxflow.bench.offline import parse_engine_args
from voxflow.bench.workloads import load_prompts, ordered, unique
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.gc_freeze import freeze_startup_objects
from voxflow.engine.request import SamplingOptions, SpeechRequest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_step import kernel_summary, sync  # noqa: E402


def wave(core: EngineCore, prompts, start: int, rows: int) -> tuple[list[float], int]:
    """Add `rows` prompts at once and step until they are done: (every step's wall ms, the prompts' positions)."""
    positions = 0
    for i, p in enumerate(unique(prompts[start:start + rows], "5151", start)):
        rid = f"w{start + i}"
        core.add_request(SpeechRequest(text=p.text, voice="vivian", request_id=rid,
                                       sampling=SamplingOptions(max_new_tokens=3, ignore_eos=True)))
        positions += core.live[rid].prepared.prompt_len
    walls = []
    while core.has_work():
        sync()
        t = time.perf_counter()
        core.step()
        sync()
        walls.append((time.perf_counter() - t) * 1e3)
    return walls, positions


def main() -> None:
    model = sys.argv[1]
    args = sys.argv[2:]
    rows = int(args.pop(0)) if args and args[0].isdigit() else 64
    gpu = torch.cuda.is_available()                         # (a CPU run only checks the script)
    cfg = dict(model=model, device="cuda" if gpu else "cpu", dtype="bfloat16" if gpu else "float32",
               max_num_seqs=rows, cuda_graphs=gpu)
    cfg.update(parse_engine_args(args))
    core = EngineCore.from_config(EngineConfig(**cfg))
    freeze_startup_objects()
    prompts = ordered(load_prompts(), 6 * rows, seed=0)
    for w in range(2):                                      # warm: kernels compiled, graphs captured
        wave(core, prompts, w * rows, rows)
    for w in range(2, 4):
        walls, positions = wave(core, prompts, w * rows, rows)
        print(f"wave {w}: {positions} prompt positions, {len(walls)} steps, {sum(walls):.1f} ms: "
              + " ".join(f"{ms:.2f}" for ms in walls), flush=True)
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        walls, _ = wave(core, prompts, 4 * rows, rows)
    print(f"profiled wave: {len(walls)} steps, {sum(walls):.1f} ms (profiler on)")
    kernel_summary(prof, 1, top=30)


if __name__ == "__main__":
    main()
