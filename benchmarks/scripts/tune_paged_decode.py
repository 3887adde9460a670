"""Times the talker's paged decode attention (voxflow/kernels/paged_decode_attention.py) on a GPU against the
shortest chunk its split-K cuts a row's context into on the device (`min_split_tokens`), at the served shapes:
16 query / 8 KV heads of 128, 16-token pages, bf16, the engine's fixed-width block tables (640 pages: the
10,240-position max_model_len, so the host's split count is the one for the longest request), the new token
appended by the kernel. Batches 1-256, contexts 120-1,500 tokens (a TTS request: a prompt of ~100 positions
plus its frames). Four layers' pools are called in turn (calls rotate through them, as the 28 layers do).
Each setting's output is checked against min_split_tokens=16 (the former behaviour) before it is timed.

    python benchmarks/scripts/tune_paged_decode.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402  (same timing method)

from voxflow.kernels.paged_decode_attention import paged_decode_attention  # noqa: E402

HQ, HKV, D, BS, WIDTH, LAYERS = 16, 8, 128, 16, 640, 4
DTYPE = torch.bfloat16
MINS = (16, 32, 64, 128, 256)


def workload(batch: int, ctx: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    pages = -(-ctx // BS)
    blocks = batch * pages + 1
    pools = [(torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE).cuda(),
              torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE).cuda()) for _ in range(LAYERS)]
    tables = torch.full((batch, WIDTH), -1, dtype=torch.long)
    for b in range(batch):
        tables[b, :pages] = torch.arange(b * pages, (b + 1) * pages)
    lens = torch.randint(max(1, ctx - 15), ctx + 1, (batch,), generator=gen)      # rows a few frames apart
    slots = torch.stack([tables[b, (n - 1) // BS] * BS + (n - 1) % BS for b, n in enumerate(lens.tolist())])
    q = torch.randn(batch, HQ, D, generator=gen).to(DTYPE).cuda()
    k_new = torch.randn(batch, HKV, D, generator=gen).to(DTYPE).cuda()
    v_new = torch.randn(batch, HKV, D, generator=gen).to(DTYPE).cuda()
    return q, pools, tables.cuda(), lens.cuda(), slots.cuda(), k_new, v_new


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, us per layer call (CUDA-graph replays, {LAYERS} layers' "
          f"pools in turn); min_split_tokens: {', '.join(map(str, MINS))}")
    scale = D ** -0.5
    for batch in (1, 16, 64, 256):
        for ctx in (120, 250, 600, 1500):
            q, pools, tables, lens, slots, k_new, v_new = workload(batch, ctx, 0)

            def layers(m):
                return [paged_decode_attention(q, k, v, tables, lens, scale, k_new=k_new, v_new=v_new, slots=slots,
                                               min_split_tokens=m) for k, v in pools]
            want = layers(16)
            times = []
            for m in MINS:
                for got, ref in zip(layers(m), want):
                    torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=1e-3)
                times.append(bench(lambda: layers(m), LAYERS))
            best = MINS[min(range(len(MINS)), key=times.__getitem__)]
            print(f"B {batch:3} ctx {ctx:5} | " + "  ".join(f"{m:>3}: {t:6.1f}" for m, t in zip(MINS, times))
                  + f" | best {best} ({times[0] / min(times):.2f}x of 16)", flush=True)
            pools = None                          # free this workload before the next
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
