#!/usr/bin/env bash
# Session 21 call 1 (prepared at the end of session 20). Run name: 2026-12-03-session21/call1.
# `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl",
# ".device_tree"]; one archive back (r.tgz). About 400 s:
#  0. first, two GPU tests alone, of code that has not run on a GPU yet: the stack limit (the review's mends,
#     c66db39 / e7b6b95: the runtime's calls under torch.cuda.device, argtypes, the libcudart of PyTorch's CUDA
#     major), and the decode captures' one warm-up stream (graph_runner: a new stream per capture is the suspect
#     of the 20 live 32 MiB blocks, one cuBLAS workspace per stream; the probe below shows whether they are gone);
#  1. probe_allocations.py, 0.6B (2.4 GB pool, codec calls of <= 16), now by pool AND stream, three voxflow frames a
#     site, and the allocator's snapshot dumped for study here: session 20 call 3 found ~870 MiB reserved but free in
#     the default pool (warm-up runs on a stream of their own per decode capture?), 640 MiB of live q|k|v outputs
#     (20 blocks of 32 MiB, qwen3_layer.py:84 / :215) and a 1.2 GiB graph pool (the codec's, by creation order?);
#  2. the GPU tests of the engine and the codec (session 20's runs of them were cut at 200 s by Triton's JIT on
#     fresh machines: codec in call 2, engine in call 3 passed).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
gpu_tests 150 "tests/gpu/test_gpu_engine.py::test_gpu_stack_limit_shrinks_and_frees_its_local_memory" \
  "tests/gpu/test_gpu_engine.py::test_gpu_decode_captures_warm_up_on_one_stream"
cp $R/gpu_tests.txt $R/gpu_tests_first.txt
wait $CK6
python3 benchmarks/scripts/probe_allocations.py /tmp/real-0.6b 64 --dump $R/allocations_0p6b.pickle \
  kv_cache_bytes=2400000000 codec_max_batch=16 2>&1 | grep -v Warning | tee $R/probe_allocations.txt | tail -80
gzip -f $R/allocations_0p6b.pickle
echo "  at ${SECONDS}s"
gpu_tests 300 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py
echo "done at ${SECONDS}s"
