"""What the caching allocator holds once the engine serves: its segments by memory pool (the default pool, each CUDA
graph pool) and stream, and the live tensors grouped by the voxflow lines that allocated them.

The 0.6B configuration (2.4 GB KV pool, codec calls of <= 16) peaks at ~6 GiB of tensors and ~8.2 GiB reserved
(session 20 call 2), for ~2.2 GiB of weights and 2.2 GiB of KV: this says where the rest is.

    python benchmarks/scripts/probe_allocations.py MODEL_DIR CONCURRENCY [--dump PATH] [KEY=VALUE engine args]

--dump PATH: also write the allocator's snapshot while serving (torch.cuda.memory._dump_snapshot: every segment and
block with its Python stack; read it at https://pytorch.org/memory_viz or with pickle) for study off the GPU.
"""
import sys
from collections import defaultdict

import torch

from probe_common import add_requests, build_engine

MIB = 2 ** 20


def site(frames: list[dict], depth: int = 3) -> str:
    """The innermost `depth` voxflow frames of an allocation's Python stack, innermost first (else its innermost
    frame): the line that allocated and the calls that led there."""
    ours = [f"{f['filename'].split('/voxflow/')[-1]}:{f.get('line')} {f.get('name')}"
            for f in frames if "/voxflow/" in f.get("filename", "")]
    if ours:
        return " < ".join(ours[:depth])
    return f"{frames[0].get('filename', '?')}:{frames[0].get('line')}" if frames else "(no stack)"


def summarize(label: str) -> None:
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    pools = defaultdict(lambda: [0, 0, 0])            # (pool, stream) -> [segments, reserved, allocated]
    sites = defaultdict(lambda: [0, 0])               # site -> [blocks, bytes]
    for seg in snap["segments"]:
        # By stream too: a block freed on one stream is cached for that stream only (a warm-up run on a stream of
        # its own leaves its memory reserved where nothing else allocates).
        p = pools[f"{seg.get('segment_pool_id', '?')} stream {seg.get('stream', '?')}"]
        p[0] += 1
        p[1] += seg["total_size"]
        p[2] += seg["allocated_size"]
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                s = sites[site(block.get("frames", []))]
                s[0] += 1
                s[1] += block["size"]
    print(f"== {label}: reserved {torch.cuda.memory_reserved() / MIB:.0f} MiB, allocated "
          f"{torch.cuda.memory_allocated() / MIB:.0f} MiB, peak allocated {torch.cuda.max_memory_allocated() / MIB:.0f}"
          f" MiB, peak reserved {torch.cuda.max_memory_reserved() / MIB:.0f} MiB", flush=True)
    for pool, (n, reserved, allocated) in sorted(pools.items(), key=lambda kv: -kv[1][1]):
        print(f"  pool {pool:32s} {n:5d} segments  reserved {reserved / MIB:8.0f} MiB  allocated "
              f"{allocated / MIB:8.0f} MiB")
    for where, (n, size) in sorted(sites.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {size / MIB:8.1f} MiB  {n:5d} blocks  {where}")


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    rest = sys.argv[3:]
    dump = None
    if "--dump" in rest:
        at = rest.index("--dump")
        dump = rest[at + 1]
        del rest[at:at + 2]
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    core = build_engine(model, concurrency, rest)
    summarize("after startup")
    add_requests(core, concurrency, 80)
    for _ in range(40):                                # past the prefills and a wave of codec chunks
        core.step()
    summarize("serving 64 requests, 40 steps in")
    if dump:
        torch.cuda.memory._dump_snapshot(dump)


if __name__ == "__main__":
    main()
