#!/usr/bin/env bash
# Whether the cuBLAS kernels of the 64-row decode GEMMs take part in programmatic dependent launch (PDL): if their
# machine code holds the grid-dependency wait, a captured graph's edges into them could be made programmatic, so a
# GEMM's launch and prologue overlap the kernel before it (today every edge into a cuBLAS kernel is a full one:
# voxflow/kernels/pdl.py). First the SASS that `griddepcontrol.wait` / `.launch_dependents` compile to (a two-line
# CUDA kernel through nvcc), then those instructions counted in the SASS Nsight Compute prints of each GEMM kernel
# torch runs at 64 rows.
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
# The nvjet kernels are not in the library's fatbin by name (cuobjdump -fun finds none): Nsight Compute prints the
# SASS of each as it runs.
cat > gemms.py <<'PY'
import torch, torch.nn.functional as F
shapes = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))
xs = {k: torch.randn(64, k, device="cuda").bfloat16() for _, k in shapes}
ws = [torch.randn(n, k, device="cuda").bfloat16() for n, k in shapes]
res = torch.randn(64, 1024, device="cuda").bfloat16()
for w in ws:
    n, k = w.shape
    res.clone().addmm_(xs[k], w.t()) if n == 1024 else F.linear(xs[k], w)
torch.cuda.synchronize()
PY
grep -v '^LIB ' kernels.txt | sed 's/<.*//; s/^void //; s/.*:://' | while read -r K; do
  timeout 200 ncu --kernel-name "regex:$K" --launch-count 1 --page source --print-source sass python3 gemms.py \
    > "ncu_sass_${K:0:60}.txt" 2>&1
  echo "== $K: $(wc -l < "ncu_sass_${K:0:60}.txt") lines; ACQBULK (wait) $(grep -c ACQBULK "ncu_sass_${K:0:60}.txt")," \
       "PREEXIT (trigger) $(grep -c PREEXIT "ncu_sass_${K:0:60}.txt")"
done
