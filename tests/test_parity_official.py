"""voxflow's Qwen3-TTS against the official implementation (qwen-tts 0.1.1), fp32 on the CPU.

The golden files were written by tools/oracle/dump_goldens.py, which ran the official code (eager attention,
greedy) on the same tiny checkpoints the test session regenerates (voxflow/tools/tiny_set.py). Compared, in the
order the data flows: prompt embeddings, x-vector and reference codes (voice clone), raw talker logits of every
step, raw code-predictor logits, generated codes, and the final waveform.
"""
import glob
import os

import pytest
import torch

from voxflow.models.qwen3_tts.generate import (SynthesisRequest, VoiceClonePrompt, decode_to_wav, generate_codes,
                                               make_voice_clone_prompt, prepare)
from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.sampling import RequestSampler

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "fixtures", "golden")
TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
CASES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(GOLDEN_DIR, "*.pt"))
               if not os.path.basename(p).startswith("codec_"))

PROMPT_ATOL = 1e-5
LOGITS_ATOL = 1e-4
WAV_ATOL = 1e-4
ENCODER_ATOL = 1e-4

_models: dict[str, Qwen3TTS] = {}


def model_for(checkpoint: str) -> Qwen3TTS:
    if checkpoint not in _models:
        _models[checkpoint] = Qwen3TTS.from_pretrained(os.path.join(TINY, checkpoint))
    return _models[checkpoint]


def load_golden(name: str) -> dict:
    return torch.load(os.path.join(GOLDEN_DIR, name + ".pt"), weights_only=False)


def requests_of(golden: dict) -> list[SynthesisRequest]:
    """The golden's official call, as one voxflow request per batch row."""
    req = dict(golden["request"])
    n = len(req["text"]) if isinstance(req["text"], list) else 1
    rows = []
    for i in range(n):
        pick = (lambda v: v[i] if isinstance(v, list) else v)
        rows.append(SynthesisRequest(
            text=pick(req["text"]), speaker=pick(req.get("speaker")), instruct=pick(req.get("instruct")),
            language=pick(req.get("language")), ref_text=req.get("ref_text"),
            x_vector_only=bool(req.get("x_vector_only_mode", False)),
            non_streaming_mode=req.get("non_streaming_mode"), greedy=True,
            max_new_tokens=golden["meta"]["max_new_tokens"]))
    return rows


def clone_prompt(model, golden, request) -> VoiceClonePrompt | None:
    if "ref_audio" not in golden:
        return None
    from voxflow.audio.io import resample
    audio = golden["ref_audio"].numpy()
    sr = golden["request"]["ref_sr"]
    if sr != model.sample_rate:
        audio = resample(audio, sr, model.sample_rate)
    return make_voice_clone_prompt(model, audio, request.ref_text, request.x_vector_only)


def unpad_prompt(golden: dict, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = golden["talker_in"]
    mask = t["attention_mask"][row].bool()
    return t["inputs_embeds"][row][mask], t["trailing_text_hidden"][row]


@pytest.fixture(scope="module", params=CASES or ["<none>"])
def case(request):
    if request.param == "<none>":
        pytest.skip("no golden fixtures in tests/fixtures/golden (run tools/oracle/dump_goldens.py)")
    golden = load_golden(request.param)
    model = model_for(golden["meta"]["checkpoint"])
    boost = golden["request"].get("eos_boost")
    eos_row = model.talker.codec_head.weight.data[model.config.talker.codec_eos_token_id]
    saved = eos_row.clone()
    if boost is not None:       # the oracle scaled the EOS row of codec_head the same way
        eos_row *= boost
    try:
        results = run_rows(model, golden)
    finally:
        eos_row.copy_(saved)
    return golden, results


def run_rows(model, golden):
    results = []
    for row, req in enumerate(requests_of(golden)):
        clone = clone_prompt(model, golden, req)
        req.voice_clone_prompt = clone
        prompt, params, max_new, _ = prepare(model, req)
        codes, finish, tl, cl = generate_codes(model, prompt, RequestSampler(params), max_new, record_logits=True)
        wav = decode_to_wav(model, codes, clone.ref_codes if clone is not None else None)
        results.append(dict(row=row, clone=clone, prompt=prompt, codes=codes, finish=finish, talker_logits=tl,
                            cp_logits=cl, wav=wav))
    return results


def test_prompt_embeddings(case):
    golden, results = case
    for r in results:
        embeds, trailing = unpad_prompt(golden, r["row"])
        assert r["prompt"].inputs_embeds.shape == embeds.shape
        torch.testing.assert_close(r["prompt"].inputs_embeds, embeds, atol=PROMPT_ATOL, rtol=0)
        n = r["prompt"].trailing_text.shape[0]
        # a batch right-pads the trailing queue with tts_pad, which is what voxflow feeds after its end anyway
        torch.testing.assert_close(r["prompt"].trailing_text, trailing[:n], atol=PROMPT_ATOL, rtol=0)
        pad = golden["talker_in"]["tts_pad_embed"].reshape(-1)
        torch.testing.assert_close(trailing[n:], pad.expand(trailing.shape[0] - n, -1), atol=PROMPT_ATOL, rtol=0)
        torch.testing.assert_close(r["prompt"].tts_pad_embed.reshape(-1), pad, atol=PROMPT_ATOL, rtol=0)


def test_voice_clone_inputs(case):
    golden, results = case
    if "ref_spk_embedding" not in golden:
        pytest.skip("not a voice-clone case")
    for r in results:
        torch.testing.assert_close(r["clone"].x_vector.float(), golden["ref_spk_embedding"][r["row"]].float(),
                                   atol=ENCODER_ATOL, rtol=0)
        ref = golden["ref_code"][r["row"]]
        if ref is None:
            assert r["clone"].ref_codes is None
        else:
            assert torch.equal(r["clone"].ref_codes.cpu(), ref.cpu())


def test_greedy_codes_and_logits(case):
    golden, results = case
    for r in results:
        expected = golden["codes"][r["row"]]
        if "eos_boost" in golden["request"]:
            assert r["finish"] == "eos" and expected.shape[0] < golden["meta"]["max_new_tokens"] - 1
        else:
            assert r["finish"] == "length" and expected.shape[0] == golden["meta"]["max_new_tokens"] - 1 >= 30
        assert torch.equal(r["codes"], expected.to(r["codes"])), f"codes differ (row {r['row']})"
        ours = torch.stack(r["talker_logits"])
        assert ours.shape[0] == golden["num_talker_steps"]          # one c0 sampled per step, EOS included
        official = golden["talker_logits"][:, r["row"]]            # the steps kept in the fixture
        torch.testing.assert_close(ours[golden["talker_steps"]], official, atol=LOGITS_ATOL, rtol=0)
        cp_ours = torch.stack(r["cp_logits"])[golden["cp_frames"]]
        torch.testing.assert_close(cp_ours, golden["cp_logits"][:, :, r["row"]], atol=LOGITS_ATOL, rtol=0)


def test_waveform(case):
    golden, results = case
    for r in results:
        expected = golden["wav"][r["row"]].numpy()
        assert r["wav"].shape == expected.shape
        assert abs(r["wav"] - expected).max() <= WAV_ATOL


def test_codec_long_audio_uses_the_official_300_25_windows():
    """> 300 frames: the official decode restarts every 300 frames with 25 frames of context."""
    from voxflow.models.qwen3_tts.codec_decoder import official_decode
    path = os.path.join(GOLDEN_DIR, "codec_long.pt")
    if not os.path.exists(path):
        pytest.skip("codec_long.pt golden missing (run tools/oracle/dump_goldens.py)")
    g = torch.load(path, weights_only=False)
    model = model_for(g["meta"]["checkpoint"])
    wav = official_decode(model.codec_decoder, g["codes"].long()[None])[0]
    assert wav.numel() == g["wav_len"] == g["codes"].shape[0] * 1920
    lo = g["slice_start"]
    ours = wav[lo:lo + g["wav_slice"].numel()]
    torch.testing.assert_close(ours, g["wav_slice"], atol=WAV_ATOL, rtol=0)


def test_codec_encoder_batch_matches_official_codes():
    path = os.path.join(GOLDEN_DIR, "codec_encode.pt")
    if not os.path.exists(path):
        pytest.skip("codec_encode.pt golden missing (run tools/oracle/dump_goldens.py)")
    g = torch.load(path, weights_only=False)
    model = model_for("base")
    audio = g["audio"]
    codes = model.codec_encoder.encode_batch([audio, audio[:24000]])
    assert len(codes) == len(g["codes"]) == 2
    for ours, theirs in zip(codes, g["codes"]):
        assert ours.shape == theirs.shape
        assert torch.equal(ours.cpu(), theirs.cpu())
