"""codec_precision.py: how codec_dtype="auto" picks the codec decoder's precision, and the fp16 check behind it,
on the small random decoder of test_codec_decoder.py (CPU: PyTorch's fp16 convolutions are slow there but exact
enough to show the check's verdicts)."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from test_codec_decoder import random_decoder  # tests/test_codec_decoder.py
from voxflow.models.qwen3_tts.codec_decoder_blocks import SnakeBeta
from voxflow.models.qwen3_tts.codec_precision import AUTO_MIN_SNR_DB, half_precision_check, resolve_codec_dtype

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")          # conftest.py writes the tiny checkpoints


def overflowing_decoder():
    """The same decoder with one SnakeBeta whose 1 / (e^beta + 1e-9) is ~1e9: finite in fp32, inf in fp16 (the
    1e-9 rounds to 0 there and e^-30 underflows)."""
    dec = random_decoder(seed=7)
    snake = next(m for m in dec.decoder.modules() if isinstance(m, SnakeBeta))
    with torch.no_grad():
        snake.beta.fill_(-30.0)
    return dec


def test_fp16_check_passes_a_healthy_decoder_and_fails_one_that_overflows():
    ok = half_precision_check(random_decoder(seed=7), torch.float16, frames=4)
    assert ok["finite"] and ok["snr_db"] >= AUTO_MIN_SNR_DB, ok
    bf16 = half_precision_check(random_decoder(seed=7), torch.bfloat16, frames=4)
    assert bf16["snr_db"] < ok["snr_db"] - 10.0, (bf16, ok)          # the check tells precisions apart
    bad = half_precision_check(overflowing_decoder(), torch.float16, frames=4)
    assert not bad["finite"] or bad["snr_db"] < AUTO_MIN_SNR_DB, bad
    broken = random_decoder(seed=7)                  # NaN already in fp32: no reference to measure against
    with torch.no_grad():
        broken.decoder[-1].conv.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="fp32 decode of random codes is not finite"):
        half_precision_check(broken, torch.float16, frames=4)


def spied_decoder(monkeypatch, plain_fails: bool = False):
    """(the random decoder, the list its passes append (parameter dtype, kernels on?) to), with the kernels' switch on
    as on a GPU (the decoder still runs its CPU path); plain_fails: a pass with the kernels off raises."""
    from voxflow import kernels
    monkeypatch.setattr(kernels, "_enabled", True)
    monkeypatch.setattr(kernels, "_triton_available", lambda: True)
    dec = random_decoder(seed=7)
    forward, seen = type(dec).forward, []

    def spying(self, *args, **kwargs):
        seen.append((next(self.parameters()).dtype, kernels.kernels_enabled()))
        if plain_fails and not kernels.kernels_enabled():
            raise RuntimeError("no plain path here")
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(type(dec), "forward", spying)
    return dec, seen


def test_the_reference_pass_is_plain_pytorch_and_the_copy_runs_the_kernels(monkeypatch):
    """The check's fp32 reference runs with the Triton kernels off (nothing compiled for a precision the codec will
    not serve; the fp16 kernels held against plain PyTorch); the switch is as it was after, also when a pass
    raises."""
    from voxflow import kernels
    dec, seen = spied_decoder(monkeypatch)
    assert half_precision_check(dec, torch.float16, frames=4)["reference"] == "plain"
    assert seen == [(torch.float32, False), (torch.float16, True)] and kernels.kernels_enabled()
    with pytest.raises(RuntimeError, match="boom"):
        with kernels.kernels_off():
            assert not kernels.kernels_enabled()
            raise RuntimeError("boom")
    assert kernels.kernels_enabled()
    monkeypatch.setattr(kernels, "_enabled", False)       # off before: off after
    with kernels.kernels_off():
        pass
    assert not kernels.kernels_enabled()


def test_a_plain_reference_that_fails_gives_way_to_the_kernels_fp32_decode(monkeypatch, caplog):
    """Should the plain PyTorch pass fail where the kernels' would not, the check still runs, against the kernels'
    fp32 decode (as before it had a plain reference), and says so: a server never loses its fp16 codec to it."""
    from voxflow import kernels
    dec, seen = spied_decoder(monkeypatch, plain_fails=True)
    with caplog.at_level(logging.WARNING, logger="voxflow.codec"):
        check = half_precision_check(dec, torch.float16, frames=4)
    assert check["reference"] == "kernels" and check["finite"] and check["snr_db"] >= AUTO_MIN_SNR_DB
    assert seen == [(torch.float32, False), (torch.float32, True), (torch.float16, True)]
    assert "plain fp32 reference failed" in caplog.text and kernels.kernels_enabled()


def test_auto_picks_fp16_on_a_gpu_only_when_the_check_passes(caplog):
    assert resolve_codec_dtype("auto", random_decoder(seed=7), gpu=True)[0] == "float16"
    with caplog.at_level(logging.WARNING, logger="voxflow.codec"):
        chosen, report = resolve_codec_dtype("auto", overflowing_decoder(), gpu=True)
    assert chosen == "float32" and report["why"] == "fp16 check failed" and "fp16 check failed" in caplog.text
    # no GPU: fp32 without a check
    assert resolve_codec_dtype("auto", random_decoder(seed=7)) == ("float32", {"requested": "auto",
                                                                               "dtype": "float32", "why": "no GPU"})


def test_explicit_dtypes_are_kept_and_a_failing_fp16_is_warned_about(caplog):
    for name in ("float32", "bfloat16"):
        assert resolve_codec_dtype(name, random_decoder(seed=7), gpu=True) == (name, {"requested": name,
                                                                                      "dtype": name})
    with caplog.at_level(logging.WARNING, logger="voxflow.codec"):
        chosen, report = resolve_codec_dtype("float16", overflowing_decoder(), gpu=False)
    assert chosen == "float16" and "expect degraded audio" in caplog.text and report["check"]["dtype"] == "float16"
    with pytest.raises(ValueError, match="codec_dtype must be one of"):
        resolve_codec_dtype("fp16", random_decoder(seed=7))


def test_the_loader_resolves_auto_and_reports_it():
    from voxflow.models.qwen3_tts.engine_loader import load
    _, codec = load(os.path.join(TINY, "custom_voice"), max_slots=2)
    assert codec.dtype == torch.float32 and codec.precision == {"requested": "auto", "dtype": "float32",
                                                                "why": "no GPU"}
    _, codec = load(os.path.join(TINY, "custom_voice"), max_slots=2, codec_dtype="float16")
    assert codec.dtype == torch.float16 and codec.precision["check"]["finite"]


@pytest.fixture
def tf32_on():
    """Both TF32 switches on (as serving has them) for the test, then as they were (torch.backends.cuda.matmul
    takes no monkeypatch: its attributes are properties of a module object)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_check_restores_the_tf32_switches_frees_derived_weights_and_auto_survives_its_errors(monkeypatch,
                                                                                                   tf32_on):
    """The check turns TF32 off for its fp32 reference and restores the switches, also when the decode raises;
    it drops weights the kernels derived during its fp32 pass (they would hold GPU memory the KV pool is sized
    from); an "auto" whose check raises (out of memory, a kernel that does not compile) falls back to fp32, an
    explicit float16 does not hide the error."""
    from voxflow.models.qwen3_tts.codec_decoder import CodecDecoder
    dec = random_decoder(seed=7)
    conv = dec.decoder[-1]
    conv._derived = ("stale key", torch.zeros(3))
    half_precision_check(dec, torch.float16, frames=2)
    assert conv._derived is None
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32

    def boom(self, codes, state=None):
        raise RuntimeError("no fp16 kernel here")
    monkeypatch.setattr(CodecDecoder, "forward", boom)
    with pytest.raises(RuntimeError, match="no fp16 kernel"):
        half_precision_check(dec, torch.float16, frames=2)
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert resolve_codec_dtype("auto", dec, gpu=True) == ("float32", {"requested": "auto", "dtype": "float32",
                                                                      "why": "fp16 check error: RuntimeError"})
    with pytest.raises(RuntimeError, match="no fp16 kernel"):
        resolve_codec_dtype("float16", dec, gpu=True)
