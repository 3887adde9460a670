"""gemm_sm_target on the GPU: cuBLAS planned for fewer SMs gives the same products (within the summation order's
rounding) inside a CUDA graph, and the handle's target and PyTorch's carveout are put back afterwards."""
import pytest
import torch

from voxflow.engine import gemm_sm_target as gst

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_gpu_sm_target_is_set_inside_and_restored_after():
    handle = torch.cuda.current_blas_handle()
    lib = gst._cublas_library()
    assert lib is not None, "libcublas with cublasSetSmCountTarget not found in /proc/self/maps"
    with torch.cuda.stream(torch.cuda.Stream()):
        # the design's premise: one cuBLAS handle per thread, whatever stream a capture's warm-up runs on
        assert torch.cuda.current_blas_handle() == handle
    before = gst._handle_target(lib, handle), torch._C._get_sm_carveout_experimental()
    total = torch.cuda.get_device_properties(0).multi_processor_count
    with gst.gemm_sm_target(40, torch.device("cuda")):
        assert gst._handle_target(lib, handle) == 40
        assert torch._C._get_sm_carveout_experimental() == total - 40
    assert (gst._handle_target(lib, handle), torch._C._get_sm_carveout_experimental()) == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_graph_captured_under_a_target_equals_the_plain_product(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 1024, device="cuda", dtype=dtype)
    w = torch.randn(6144, 1024, device="cuda", dtype=dtype) / 32
    plain = torch.nn.functional.linear(x, w)
    out = {}
    with gst.gemm_sm_target(64, torch.device("cuda")):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.nn.functional.linear(x, w)                  # warm-up (workspace) outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out["y"] = torch.nn.functional.linear(x, w)
    graph.replay()
    torch.cuda.synchronize()
    # another split of K sums in another order: fp32 within ~1e-5 relative, bf16 within its rounding of the output
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["y"], plain, **tol)


def _kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("lt", [False, True], ids=["handle", "cublaslt"])
def test_gpu_a_small_target_changes_the_kernel_cublas_picks(lt, monkeypatch):
    """A 64-row gate|up (1024 -> 6144, bf16) planned for 16 SMs must not run the kernel planned for all of them
    (a tile / split-K for 96+ programs): else cuBLAS ignores the target here and talker_gemm_sms can change
    nothing (lt: through cuBLASLt, gemm_sm_target.PREFER_LT). The names are printed for the record."""
    monkeypatch.setattr(gst, "PREFER_LT", lt)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 1024, device="cuda", dtype=torch.bfloat16)
    plain = _kernels(lambda: torch.nn.functional.linear(x, w))
    with gst.gemm_sm_target(16, torch.device("cuda")):
        planned = _kernels(lambda: torch.nn.functional.linear(x, w))
    print("lt" if lt else "handle", "plain:", plain, "| 16 SMs:", planned)
    assert plain and planned and plain != planned
