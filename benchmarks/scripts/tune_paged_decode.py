"""Times the talker's paged decode attention (voxflow/kernels/paged_decode_attention.py) at the served batch sizes
on a GPU: 1.7B talker heads (16 q / 8 kv of 128), bf16, 16-token pages scattered over the pool (a shuffled page
order, as a long-running server's block manager leaves them), every row at the same context length.

The default mode and --matrix sweep the CUDA-core variant (tensor_cores=False); --tc the tensor-core one.

For each (rows, context): the heuristic's launch (default_num_splits from the table width, default tile and warps)
and candidates (splits 1 / 2 / 4 / 8, tiles of 16 / 32 / 64 tokens, 2 / 4 / 8 warps), us a call from CUDA-graph
replays, and the K/V bandwidth the best one reaches. Each candidate's output is checked against the heuristic's.
Session 13 saw 79 us a layer at 256 rows in the served step (benchmarks/results/h200/2026-12-02-session13).

    python benchmarks/scripts/tune_paged_decode.py [--rows 64,256] [--contexts 64,128,256] [--width 4096]
    python benchmarks/scripts/tune_paged_decode.py --matrix [--rows ...] [--contexts ...]

--matrix: every candidate at every context for each row count, each call over its own page set (ROTATE sets a
graph, so the K/V a call reads is not still in L2 from the call before, as in the served step where 27 other
layers run in between); then, per row count, the candidate whose worst ratio to the best time over the contexts
is smallest (the launch is chosen on the host, which does not know the contexts).

    python benchmarks/scripts/tune_paged_decode.py --tc [--baseline OLD_MODULE.py] [--rows ...] [--contexts ...]

--tc: the served call (the new token appended by the kernel): the default launch, the CUDA-core and tensor-core
variants' own defaults, tensor-core candidates (tile, warps, stages, splits), and optionally a baseline: the same
call through another version of the kernel module (a file, e.g. `git show REV:voxflow/kernels/
paged_decode_attention.py`), with its own defaults. Same page-set rotation as --matrix. (Session 18's call 2 ran
a `--chunks` mode of this script, at 474f20f, over launch options removed since.)
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402

from voxflow.kernels.paged_decode_attention import default_num_splits, paged_decode_attention  # noqa: E402

HQ, HKV, D, PAGE = 16, 8, 128, 16


def batch(rows: int, ctx: int, width_tokens: int):
    width = width_tokens // PAGE
    pages = rows * width + 1
    k_pool = torch.randn(pages, PAGE, HKV, D, device="cuda").to(torch.bfloat16)
    v_pool = torch.randn_like(k_pool)
    order = torch.randperm(pages - 1, device="cuda")[: rows * width].view(rows, width) + 1
    q = torch.randn(rows, HQ, D, device="cuda").to(torch.bfloat16)
    lens = torch.full((rows,), ctx, device="cuda", dtype=torch.int32)
    return q, k_pool, v_pool, order, lens


ROTATE = 4


def matrix(rows_list: list[int], contexts: list[int], width_tokens: int) -> None:
    candidates = [None] + list(itertools.product((1, 2, 4, 8), (16, 32, 64), (2, 4)))
    scale = D ** -0.5
    for rows in rows_list:
        times = {}                                       # (candidate, ctx) -> us a call
        for ctx in contexts:
            sets = [batch(rows, ctx, width_tokens) for _ in range(ROTATE)]
            # The CUDA-core variant's launches (the tensor-core variant has its own mode, --tc).
            ref = [paged_decode_attention(q, k, v, t, n, scale, tensor_cores=False) for q, k, v, t, n in sets]
            for cand in candidates:
                kw = dict(tensor_cores=False) if cand is None else dict(
                    num_splits=cand[0], block_n=cand[1], num_warps=cand[2], tensor_cores=False)
                try:
                    outs = [paged_decode_attention(q, k, v, t, n, scale, **kw) for q, k, v, t, n in sets]
                    if not all(torch.allclose(o.float(), r.float(), atol=2e-2, rtol=2e-2) for o, r in zip(outs, ref)):
                        print(f"  rows {rows} ctx {ctx} {cand}: WRONG RESULT")
                        continue
                    times[cand, ctx] = bench(lambda: [paged_decode_attention(q, k, v, t, n, scale, **kw)
                                                      for q, k, v, t, n in sets], ROTATE)
                except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
                    print(f"  rows {rows} ctx {ctx} {cand}: {type(e).__name__}: {str(e)[:100]}")
            sets = ref = None
            torch.cuda.empty_cache()
        heur = f"heuristic (splits {default_num_splits(rows, HKV, width_tokens, torch.device('cuda'))})"
        print(f"rows {rows}: us a call by context ({ROTATE} page sets rotated), ratio to the best at that context")
        print(f"{'candidate':>24} | " + " ".join(f"{c:>12}" for c in contexts) + " |  worst")
        best_at = {c: min(t for (k, cc), t in times.items() if cc == c) for c in contexts}
        worst = {}
        for cand in candidates:
            if not all((cand, c) in times for c in contexts):
                continue
            worst[cand] = max(times[cand, c] / best_at[c] for c in contexts)
            name = heur if cand is None else f"(splits, tile, warps) {cand}"
            cells = " ".join(f"{times[cand, c]:6.1f} {times[cand, c] / best_at[c]:4.2f}x" for c in contexts)
            print(f"{name[-24:]:>24} | {cells} | {worst[cand]:5.2f}")
        pick = min(worst, key=worst.get)
        print(f"rows {rows}: most robust {pick} (worst {worst[pick]:.2f}x of the best); heuristic worst "
              f"{worst.get(None, float('nan')):.2f}x", flush=True)


def load_module(path: str):
    """A kernel module from a file (another revision of paged_decode_attention.py), importable beside ours."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("baseline_paged_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def appended(rows: int, ctx: int, width_tokens: int):
    """A batch as `batch` makes it, plus the step's new token (k/v handed to the kernel, written to page 0, which no
    table holds: the pools' contents stay fixed from call to call)."""
    q, k_pool, v_pool, tables, lens = batch(rows, ctx, width_tokens)
    k_new = torch.randn(rows, HKV, D, device="cuda").to(torch.bfloat16)
    slots = torch.arange(rows, device="cuda") % PAGE
    return q, k_pool, v_pool, tables, lens, dict(k_new=k_new, v_new=torch.randn_like(k_new), slots=slots)


def compare(rows_list: list[int], contexts: list[int], width_tokens: int, baseline: str | None) -> None:
    old = load_module(baseline) if baseline else None
    scale = D ** -0.5
    # name -> keyword arguments; tensor-core candidates as (tile, warps, stages, splits)
    candidates = {"default": {}, "cuda cores": dict(tensor_cores=False), "tensor cores": dict(tensor_cores=True)}
    if old:
        candidates["baseline"] = None
    for tile, warps, stages, splits in itertools.product((32, 64), (4, 8), (2,), (1, 2, 4)):
        if tile == 64 and warps == 4:
            continue                                         # spills (compile_check: 255 registers + stack)
        candidates[f"tc {tile} {warps}w {stages}st {splits}sp"] = dict(
            tensor_cores=True, block_n=tile, num_warps=warps, num_stages=stages, num_splits=splits)

    def call(name, q, k, v, t, n, new):
        if candidates[name] is None:
            return old.paged_decode_attention(q, k, v, t, n, scale, **new)
        return paged_decode_attention(q, k, v, t, n, scale, **candidates[name], **new)

    for rows in rows_list:
        times = {}
        for ctx in contexts:
            sets = [appended(rows, ctx, width_tokens) for _ in range(ROTATE)]
            ref = [paged_decode_attention_ref_like(*s_) for s_ in sets]
            for name in candidates:
                try:
                    outs = [call(name, *s_) for s_ in sets]
                    if not all(torch.allclose(o.float(), r.float(), atol=2e-2, rtol=2e-2) for o, r in zip(outs, ref)):
                        print(f"  rows {rows} ctx {ctx} {name}: WRONG RESULT")
                        continue
                    times[name, ctx] = bench(lambda: [call(name, *s_) for s_ in sets], ROTATE)
                except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
                    print(f"  rows {rows} ctx {ctx} {name}: {type(e).__name__}: {str(e)[:100]}")
            sets = ref = None
            torch.cuda.empty_cache()
        print(f"rows {rows}: us a call by context, ratio to the best at that context")
        print(f"{'candidate':>24} | " + " ".join(f"{c:>12}" for c in contexts) + " |  worst")
        best_at = {c: min(t for (k, cc), t in times.items() if cc == c) for c in contexts}
        for name in candidates:
            if all((name, c) in times for c in contexts):
                cells = " ".join(f"{times[name, c]:6.1f} {times[name, c] / best_at[c]:4.2f}x" for c in contexts)
                worst = max(times[name, c] / best_at[c] for c in contexts)
                print(f"{name:>24} | {cells} | {worst:5.2f}", flush=True)


def paged_decode_attention_ref_like(q, k_pool, v_pool, tables, lens, new):
    """The reference for an appended call: the CUDA-core variant (held to paged_decode_attention_ref by the GPU
    tests) on copies of the pools (it writes the new token, which the tables do not hold)."""
    return paged_decode_attention(q, k_pool.clone(), v_pool.clone(), tables, lens, D ** -0.5, tensor_cores=False,
                                  **new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--contexts", default="64,128,256")
    ap.add_argument("--width", type=int, default=4096, help="block-table width in tokens (what the heuristic sees)")
    ap.add_argument("--matrix", action="store_true", help="every candidate at every context (see the docstring)")
    ap.add_argument("--tc", action="store_true", help="tensor-core candidates at every context (the docstring)")
    ap.add_argument("--baseline", help="--tc: another revision of the kernel module, to time beside it")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.tc:
        print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, pages of {PAGE}, "
              f"table width {args.width} tokens, new token appended")
        compare([int(r) for r in args.rows.split(",")], [int(c) for c in args.contexts.split(",")], args.width,
               args.baseline)
        return
    if args.matrix:
        print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, pages of {PAGE}, "
              f"table width {args.width} tokens")
        matrix([int(r) for r in args.rows.split(",")], [int(c) for c in args.contexts.split(",")], args.width)
        return
    print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, pages of {PAGE}, "
          f"table width {args.width} tokens; us a call (CUDA-graph replays)")
    print(f"{'rows':>4} {'ctx':>4} | {'heuristic':>18} {'us':>7} | {'best (splits, tile, warps)':>26} {'us':>7} "
          f"{'KV GB/s':>8}")
    for rows, ctx in itertools.product([int(r) for r in args.rows.split(",")],
                                       [int(c) for c in args.contexts.split(",")]):
        q, k_pool, v_pool, tables, lens = batch(rows, ctx, args.width)
        scale = D ** -0.5
        cores = dict(tensor_cores=False)            # this mode sweeps the CUDA-core variant's launches
        ref = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, **cores)
        heur_us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, **cores), 1)
        splits = default_num_splits(rows, HKV, args.width, q.device)
        best = (heur_us, ("heuristic",))
        for s, n, w in itertools.product((1, 2, 4, 8), (16, 32, 64), (2, 4, 8)):
            try:
                out = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s, block_n=n,
                                             num_warps=w, **cores)
                if not torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2):
                    print(f"  splits {s} tile {n} warps {w}: WRONG RESULT")
                    continue
                us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s,
                                                          block_n=n, num_warps=w, **cores), 1)
            except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
                print(f"  splits {s} tile {n} warps {w}: {type(e).__name__}: {str(e)[:100]}")
                continue
            if us < best[0]:
                best = (us, (s, n, w))
        kv_bytes = 2 * rows * ctx * HKV * D * 2
        print(f"{rows:4d} {ctx:4d} | {f'splits {splits}':>18} {heur_us:7.2f} | {str(best[1]):>26} {best[0]:7.2f} "
              f"{kv_bytes / best[0] / 1e3:8.0f}")


if __name__ == "__main__":
    main()
