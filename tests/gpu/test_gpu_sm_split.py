"""GPU checks of engine/sm_split.py (VOXFLOW_TALKER_SMS=rest): the split's two streams run their kernels on disjoint
sets of SMs, each within its count, and a CUDA graph captured on the talker's stream by graph_runner replays there.
Which SM ran a program is read from the %smid register."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
pytest.importorskip("cuda.bindings", reason="needs NVIDIA's driver API bindings (pip install cuda-bindings)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from voxflow.engine import sm_split  # noqa: E402
from voxflow.engine.graph_runner import warm_then_capture  # noqa: E402

PROGRAMS = 8192          # many more than SMs, each busy a while: every SM its stream may use gets some


@triton.jit
def _smid_kernel(out_ptr, spin):
    pid = tl.program_id(0)
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    acc = pid.to(tl.float32)
    for _ in range(spin):
        acc = acc * 0.999 + 1.0
    tl.store(out_ptr + pid, tl.where(acc >= 0, smid, -2))     # (acc keeps the loop; it is never negative)


def launch(out):
    _smid_kernel[(PROGRAMS,)](out, 2000)


def sms_used(stream) -> set[int]:
    out = torch.full((PROGRAMS,), -1, dtype=torch.int32, device="cuda")
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch(out)
    stream.synchronize()
    used = set(out.tolist())
    assert -1 not in used and -2 not in used
    return used


@pytest.fixture
def made(monkeypatch):
    monkeypatch.setenv(sm_split.ENV, "rest")
    return sm_split.split(torch.device("cuda", torch.cuda.current_device()), 64)


def test_split_streams_run_on_disjoint_sms_within_their_counts(made):
    total = torch.cuda.get_device_properties(0).multi_processor_count
    first, rest = sms_used(made.first), sms_used(made.rest)
    whole = sms_used(torch.cuda.current_stream())
    assert made.first_sms >= 64 and made.rest_sms >= 1 and made.first_sms + made.rest_sms <= total
    assert not first & rest
    assert len(first) <= made.first_sms and len(rest) <= made.rest_sms
    assert len(whole) > max(len(first), len(rest))          # the partitions bind: the whole GPU spreads wider
    assert sm_split.split(torch.device("cuda", torch.cuda.current_device()), 64) is made     # one split per count


def test_a_graph_captured_on_the_rest_replays_on_the_rest(made):
    """graph_runner captures on a split stream when it is the current one (on PyTorch's own capture stream the
    kernels would replay on the whole GPU)."""
    first, rest = sms_used(made.first), sms_used(made.rest)
    out = torch.full((PROGRAMS,), -1, dtype=torch.int32, device="cuda")
    made.rest.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(made.rest):
        graph, _ = warm_then_capture(lambda: launch(out), None)
        out.fill_(-1)
        graph.replay()
    made.rest.synchronize()
    used = set(out.tolist())
    assert -1 not in used and used <= rest and not used & first
