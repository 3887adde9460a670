"""Why the code predictor's fused layers run slower in some single-token steps than in others (H200 session 29: the
same 5 x 4 layer kernels took ~137 us a step when the step's first layer read a row the token draw copied out, ~117
when a projection GEMM made that row right before; attention_o_proj 9.4 vs 6.8 us on the critical path).

One code-predictor step at the 1.7B shapes (5 fused layers of cp_layer.layer_step, then the norm + lm_head), bf16,
one row, CUDA-graph replays of 14 steps (cache positions 2..15), us a step, in chains that differ only before
the first layer:

    draw+proj     select_tokens (copies a 2048-wide row) -> skinny projection 2048 -> 1024 -> layers   (served)
    draw          select_tokens (copies a 1024-wide row straight from a table) -> layers
    draw+copy     select_tokens (1024-wide row) -> a torch copy of that row -> layers
    proj          a fixed 2048-wide row -> skinny projection -> layers (no draw)
    layers        a fixed 1024-wide row -> layers (no draw, no projection)

If `draw` is slow and `draw+copy` fast, what follows the one-program draw kernel matters (PDL: the next kernel's
programs wait on the SMs while it runs); if `layers` is slow too, the input row's producer does not matter.

    python benchmarks/scripts/probe_cp_step_chain.py [--small] [--timeline proj,layers]
        --small: tiny shapes, eager, for a CPU check under TRITON_INTERPRET=1; no timing
        --timeline: those kinds' one step kernel by kernel (exposed time on the critical path, CUPTI)
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same layers and weights)

from voxflow.kernels import cp_layer  # noqa: E402
from voxflow.kernels import select_tokens as st  # noqa: E402
from voxflow.kernels import skinny_linear as sk  # noqa: E402


def build(device: str, talker_width: int, vocab: int):
    """Layers (fused weights), a projection, an lm_head, two embedding tables, the RoPE rows and a draw's inputs."""
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    layers = cp.make_layers(5)
    weights = [_layer_weights(layer) for layer in layers]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=cp.DTYPE)
    parts = dict(
        weights=weights, norm=torch.ones(cp.H, device=device, dtype=cp.DTYPE),
        proj_w=rand(cp.H, talker_width, scale=talker_width ** -0.5), proj_b=rand(cp.H, scale=0.1),
        head=rand(vocab, cp.H, scale=cp.H ** -0.5), wide_table=rand(vocab, talker_width),
        narrow_table=rand(vocab, cp.H), wide_row=rand(1, talker_width), narrow_row=rand(1, cp.H),
        logits=rand(1, vocab, scale=3.0))
    rope = RotaryEmbedding(cp.D, 1e6, 4096).to(device).prefix(16, torch.device(device), cp.DTYPE)
    one = torch.ones(1, dtype=torch.long, device=device)
    draw = dict(do_sample=one.bool(), temperature=torch.full((1,), 0.9, device=device), top_k=one * 50,
                top_p=torch.ones(1, dtype=torch.float64, device=device), keys=one * 7, frame=one * 3)
    return parts, rope, draw


def chain(kind: str, parts: dict, rope, draw: dict, device: str):
    """A function running 14 single-token steps of `kind` (see the module docstring) on a fresh static cache."""
    from voxflow.layers.static_kv_cache import StaticKVCache

    def drawn(table: torch.Tensor) -> torch.Tensor:
        row = torch.empty(1, table.shape[1], dtype=table.dtype, device=device)
        st.select_tokens(parts["logits"], draw["do_sample"], draw["temperature"], draw["top_k"], draw["top_p"],
                         draw["keys"], draw["frame"], 3, False, embed=table, embed_out=row)
        return row

    def project(row: torch.Tensor) -> torch.Tensor:
        return sk.skinny_linear(row, parts["proj_w"], bias=parts["proj_b"])

    first = {"draw+proj": lambda: project(drawn(parts["wide_table"])),
             "draw": lambda: drawn(parts["narrow_table"]),
             "draw+copy": lambda: drawn(parts["narrow_table"]).clone(),
             "proj": lambda: project(parts["wide_row"]),
             "layers": lambda: parts["narrow_row"]}[kind]

    def steps():
        cache = StaticKVCache(5, 1, cp.HKV, 16, cp.D, cp.DTYPE, torch.device(device))
        for c in cache.layers:
            c.length = 2
        out = None
        for t in range(2, 16):
            x = first()
            cos, sin = rope[0][:, t:t + 1], rope[1][:, t:t + 1]
            for w, c in zip(parts["weights"], cache.layers):
                x = cp_layer.layer_step(x, w, cos, sin, c.k, c.v, c.claim())
            out = sk.skinny_linear(x, parts["head"], norm_weight=parts["norm"], eps=1e-6)
        return out
    return steps


KINDS = ("draw+proj", "draw", "draw+copy", "proj", "layers")


def timeline(steps, replays: int = 3) -> list[tuple[str, float]]:
    """(kernel name, exposed us) of one step from the middle of `replays` graph replays of `steps` (14 steps):
    step_timeline.py's critical path, which charges each microsecond of the stream's busy span to one kernel."""
    from torch.profiler import ProfilerActivity, profile

    from step_timeline import critical_path
    steps()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    names: dict[str, int] = {}
    rows = sorted(((names.setdefault(e.name, len(names)), 0, e.time_range.start, e.time_range.end)
                   for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda r: r[2])
    path = critical_path(rows)
    per_step = len(path) // (replays * 14)
    middle = path[len(path) // 2 - per_step // 2:][:per_step]
    by_id = {v: k for k, v in names.items()}
    return [(by_id[r[0]], r[3] + r[4]) for r in middle]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (interpreter), no timing")
    ap.add_argument("--timeline", default="", help="comma-separated kinds whose one step is printed kernel by kernel")
    args = ap.parse_args()
    if args.small:
        cp.DEVICE, cp.H, cp.I, cp.HQ, cp.HKV, cp.D = "cpu", 64, 128, 4, 2, 32
        device, talker_width, vocab = "cpu", 96, 256
    else:
        device, talker_width, vocab = "cuda", 2048, 2048
    torch.manual_seed(0)
    parts, rope, draw = build(device, talker_width, vocab)
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, {cp.DTYPE}, one row, hidden {cp.H}: "
          "us a code-predictor step (5 fused layers + lm_head), 14 steps a replay")
    with torch.no_grad():
        for kind in KINDS:
            steps = chain(kind, parts, rope, draw, device)
            if args.small:
                print(f"  {kind:10s} ran: logits {tuple(steps().shape)}")
            else:
                print(f"  {kind:10s} {cp.bench(steps, 14):7.2f} us", flush=True)
        for kind in filter(None, args.timeline.split(",")):
            rows = timeline(chain(kind, parts, rope, draw, device))
            print(f"  {kind}, one step, exposed us a kernel ({sum(t for _, t in rows):.1f} in all): "
                  + " ".join(f"{name.strip('_').split('_')[0]}:{t:.1f}" for name, t in rows), flush=True)


if __name__ == "__main__":
    main()
