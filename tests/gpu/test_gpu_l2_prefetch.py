"""The weight prefetch on a side branch (voxflow/kernels/l2_prefetch.py, VOXFLOW_L2_PREFETCH) on the GPU: the 1.7B
code predictor's frame at one row gives the same bits with it on and off, eagerly and captured in a CUDA graph that
is replayed on new inputs (the capture also proves the side stream joins back: a capture with an unjoined stream
fails), and the prefetches are issued (70 fused layer steps, 4 kernels each). A prefetch is a hint: any difference
in the results would mean the branch touched something it must not. Skipped without a Hopper-class GPU (the bulk
prefetch instruction is sm_90's)."""
import pytest
import torch

from cp_layer_reference import make_code_predictor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                reason="needs a CUDA GPU of compute capability >= 9 (run on the device machine)")
DEV = "cuda"


@pytest.fixture
def ahead(monkeypatch):
    """set(n): prefetch n kernels ahead (0: off), with the kernels on; counts the prefetches issued."""
    from voxflow.kernels import kernels_enabled, l2_prefetch, set_kernels_enabled
    saved = kernels_enabled()
    set_kernels_enabled(True)
    issued = []
    real_issue = l2_prefetch.WeightPrefetch.issue

    def counting_issue(self, w):
        done = real_issue(self, w)
        issued.append(done)
        return done
    monkeypatch.setattr(l2_prefetch.WeightPrefetch, "issue", counting_issue)

    def set_ahead(n: int):
        monkeypatch.setattr(l2_prefetch, "AHEAD", n)
        issued.clear()
        return issued
    yield set_ahead
    set_kernels_enabled(saved)


@torch.no_grad()
def test_code_predictor_frame_equals_with_prefetch_on_and_off(ahead):
    cp = make_code_predictor(torch.bfloat16, DEV)
    h = (torch.randn(1, 2048, device=DEV) * 2).to(torch.bfloat16)
    c0 = torch.randn(1, 2048, device=DEV).to(torch.bfloat16)
    greedy = lambda logits, j: logits.argmax(-1)          # noqa: E731
    assert ahead(0) == [] and cp.predict(h, c0, greedy) is not None
    codes_off, logits_off = cp.predict(h, c0, greedy)
    issued = ahead(2)
    codes_on, logits_on = cp.predict(h, c0, greedy)
    # 14 fused passes x 5 layers x 4 kernels, plus the 2 brought in before the first pass; all issued
    assert len(issued) == 14 * 5 * 4 + 2 and all(issued)
    assert torch.equal(codes_on, codes_off) and torch.equal(logits_on, logits_off)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes_g, logits_g = cp.predict(h, c0, greedy)
    h2, c02 = (torch.randn(1, 2048, device=DEV) * 2).to(torch.bfloat16), torch.randn(1, 2048, device=DEV).to(h.dtype)
    h.copy_(h2)
    c0.copy_(c02)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    ahead(0)
    codes_want, logits_want = cp.predict(h2, c02, greedy)
    assert torch.equal(codes_g, codes_want) and torch.equal(logits_g, logits_want)
