#!/usr/bin/env bash
# Whether the cuBLAS kernels of the 64-row decode GEMMs take part in programmatic dependent launch (PDL): if their
# machine code holds the grid-dependency wait, a captured graph's edges into them could be made programmatic, so a
# GEMM's launch and prologue overlap the kernel before it (today every edge into a cuBLAS kernel is a full one:
# voxflow/kernels/pdl.py). First the SASS that `griddepcontrol.wait` / `.launch_dependents` compile to (a two-line
# CUDA kernel through nvcc), then those instructions counted in each GEMM kernel torch runs at 64 rows.
#   bash benchmarks/scripts/probe_cublas_pdl.sh OUTDIR
set -uo pipefail
OUT=${1:-/tmp/probe_cublas_pdl}; mkdir -p "$OUT"; cd "$OUT"
cat > pdl.cu <<'CU'
extern "C" __global__ void waits(float *x) { asm volatile("griddepcontrol.wait;" ::: "memory"); x[threadIdx.x] += 1.f; }
extern "C" __global__ void triggers(float *x) { x[threadIdx.x] += 1.f; asm volatile("griddepcontrol.launch_dependents;"); }
extern "C" __global__ void plain(float *x) { x[threadIdx.x] += 1.f; }
CU
nvcc -arch=sm_90a -cubin -o pdl.cubin pdl.cu && cuobjdump -sass pdl.cubin > pdl_sass.txt
echo "== SASS of the three probe kernels (the PDL instructions are what 'waits' / 'triggers' have and 'plain' lacks)"
grep -E "Function|^\s+/\*[0-9a-f]{4}\*/" pdl_sass.txt | sed 's/;.*//' | awk '{$1=$1};1' | head -60
python3 - <<'PY' > kernels.txt
import torch, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
shapes = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))
xs = {k: torch.randn(64, k, device="cuda").bfloat16() for _, k in shapes}
ws = [torch.randn(n, k, device="cuda").bfloat16() for n, k in shapes]
res = torch.randn(64, 1024, device="cuda").bfloat16()
def step():
    for w in ws:
        n, k = w.shape
        (res.clone().addmm_(xs[k], w.t()) if n == 1024 else F.linear(xs[k], w))
step(); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    step(); torch.cuda.synchronize()
names = sorted({e.name for e in p.events() if e.device_type.name == "CUDA" and ("nvjet" in e.name or "splitK" in e.name)})
print("\n".join(names))
with open("/proc/self/maps") as f:
    print("LIB", sorted({l.split()[-1] for l in f if "libcublasLt" in l})[0])
PY
LIB=$(grep '^LIB ' kernels.txt | cut -d' ' -f2)
echo "== cuBLASLt: $LIB"; ls -la "$LIB"
grep -v '^LIB ' kernels.txt | while read -r K; do
  SHORT=$(echo "$K" | sed 's/<.*//; s/^void //')
  timeout 150 cuobjdump -sass -fun "$SHORT" "$LIB" > "sass_${SHORT:0:60}.txt" 2>&1
  echo "== $K: $(wc -l < "sass_${SHORT:0:60}.txt") SASS lines"
done
# The opcodes 'waits' / 'triggers' have and 'plain' lacks, then how often each GEMM kernel holds them
python3 - <<'PY'
import glob, re
def opcodes(text):
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1); funcs[cur] = []
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and cur:
            funcs[cur].append(m.group(1))
    return funcs
probe = opcodes(open("pdl_sass.txt").read())
plain = set(probe.get("plain", []))
marks = {f: sorted(set(ops) - plain) for f, ops in probe.items() if f != "plain"}
print("PDL opcodes:", marks)
wanted = {op for ops in marks.values() for op in ops}
for path in sorted(glob.glob("sass_*.txt")):
    for f, ops in opcodes(open(path).read()).items():
        print(f"{f[:90]}: {len(ops)} instructions; PDL opcodes: " + ", ".join(f"{op} x{ops.count(op)}" for op in sorted(wanted)))
PY
