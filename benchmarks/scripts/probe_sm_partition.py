"""Which SM-partition split flags let the codec's GEMMs run (engine/sm_partition.py), and how fast a GEMM runs on
a partition against the whole GPU. One subprocess per (flags, SMs): a failed launch poisons its CUDA context.

    python benchmarks/scripts/probe_sm_partition.py [SMS,...]      (GPU only; prints one line per case)
"""
import json
import subprocess
import sys

import torch


def case(flags: int, sms: int) -> dict:
    from voxflow.engine.sm_partition import partitioned_stream
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", 0)
    out = {"flags": flags, "asked": sms}
    stream, out["got"] = partitioned_stream(dev, sms, flags)
    x = torch.randn(8192, 1536, device=dev)
    w = torch.randn(1536, 2048, device=dev)

    def timed(s, fn, n=20) -> float:
        with torch.cuda.stream(s):
            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
        end.synchronize()
        return round(start.elapsed_time(end) / n, 4)

    for name, a, b in (("tf32", x, w), ("bf16", x.bfloat16(), w.bfloat16())):
        want = a @ b
        out[f"{name}_whole_ms"] = timed(torch.cuda.current_stream(), lambda: a @ b)
        out[f"{name}_part_ms"] = timed(stream, lambda: a @ b)
        with torch.cuda.stream(stream):
            got = a @ b
        stream.synchronize()
        out[f"{name}_equal"] = bool(torch.equal(got, want))
    g = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=stream):
        y = x @ w
    with torch.cuda.stream(stream):
        g.replay()
    stream.synchronize()
    out["graph_ok"] = bool(torch.allclose(y, x @ w, rtol=1e-2, atol=1e-2))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        print(json.dumps(case(int(sys.argv[2]), int(sys.argv[3]))))
        sys.exit(0)
    sms = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "66,100").split(",")]
    for flags in (2, 0, 1):
        for n in sms:
            r = subprocess.run([sys.executable, __file__, "--case", str(flags), str(n)], capture_output=True,
                               text=True, timeout=120)
            line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
            print(line or json.dumps({"flags": flags, "asked": n, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}),
                  flush=True)
