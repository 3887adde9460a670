extern "C" __global__ void waits(float *x) { asm volatile("griddepcontrol.wait;" ::: "memory"); x[threadIdx.x] += 1.f; }
extern "C" __global__ void triggers(float *x) { x[threadIdx.x] += 1.f; asm volatile("griddepcontrol.launch_dependents;"); }
extern "C" __global__ void plain(float *x) { x[threadIdx.x] += 1.f; }
