#!/usr/bin/env python3
"""Write the golden test fixtures of voxflow's Qwen3-TTS parity tests with the OFFICIAL implementation.

The official package (qwen-tts==0.1.1 with transformers==4.57.3) is run on voxflow's own tiny checkpoints
(`voxflow.tools.tiny_checkpoint`, regenerated bit-identically in CI) in fp32 on the CPU with eager attention,
greedy decoding. One file per case lands in tests/fixtures/golden/. Run it in its own virtual environment
(see tools/oracle/README.md):

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv-oracle/bin/python tools/oracle/dump_goldens.py [--out tests/fixtures/golden]

Every case stores what the official code computed, spied at the boundaries voxflow re-implements:
prompt embeddings handed to the talker, raw talker logits (all steps), raw code-predictor logits (a few frames,
to keep fixtures small), generated codes, codes handed to the codec decoder, the final waveform; for voice clone
also the reference audio, its x-vector and its reference codes.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from voxflow.bench.workloads import reference_clip  # noqa: E402  (the same clip bench uses)
from voxflow.tools.tiny_set import TINY_SET  # noqa: E402

# Logits kept per case, to keep fixtures small (all of them would be ~4 MB per case): talker steps
# (step 0 is the prefill) and frames of code-predictor logits. Codes and waveforms are kept whole.
TALKER_STEPS_KEPT = (0, 1, 2, 3, 5, 10, 20, 30)
CP_FRAMES_KEPT = (0, 29)
MAX_NEW_TOKENS = 31   # -> 30 frames without EOS


CASES = {
    # name: (checkpoint, call, kwargs)
    "cv_nonstream": ("custom_voice", "custom_voice",
                     dict(text="Hello world.", speaker="Vivian", language="English")),
    "cv_stream": ("custom_voice", "custom_voice",
                  dict(text="Hello world. This is a test.", speaker="ryan", language="english",
                       non_streaming_mode=False)),
    "cv_dialect_auto": ("custom_voice", "custom_voice", dict(text="Hello world.", speaker="Eric", language="Auto")),
    "cv_dialect_chinese": ("custom_voice", "custom_voice",
                           dict(text="你好，世界。", speaker="dylan", language="Chinese")),
    "cv_instruct_1b7": ("custom_voice_1b7", "custom_voice",
                        dict(text="Hello world.", speaker="Serena", language="English",
                             instruct="Speak happily.")),
    "cv_instruct_1b7_stream": ("custom_voice_1b7", "custom_voice",
                               dict(text="The quick brown fox.", speaker="aiden", language="Auto",
                                    instruct="Speak happily.", non_streaming_mode=False)),
    "cv_instruct_dropped_0b6": ("custom_voice", "custom_voice",
                                dict(text="Hello world.", speaker="Vivian", language="English",
                                     instruct="Speak happily.")),
    "vd_nonstream": ("voice_design", "voice_design",
                     dict(text="Hello world.", instruct="Speak happily.", language="English")),
    "vd_stream": ("voice_design", "voice_design",
                  dict(text="This is a test.", instruct="A calm voice.", language="Auto",
                       non_streaming_mode=False)),
    "base_xvec_stream": ("base", "voice_clone",
                         dict(text="Hello world.", language="English", x_vector_only_mode=True,
                              ref=(1.0, 24000))),
    "base_xvec_nonstream_16k": ("base", "voice_clone",
                                dict(text="Hello world.", language="Auto", x_vector_only_mode=True,
                                     non_streaming_mode=True, ref=(1.3, 16000))),
    "base_icl_stream_short": ("base", "voice_clone",          # T1 <= T2: text padded to the reference codes
                              dict(text="Hello world.", language="English", ref_text="The quick brown fox.",
                                   ref=(1.0, 24000))),
    "base_icl_stream_long": ("base", "voice_clone",           # T1 > T2: leftover text trails during decode
                             dict(text="Hello world. This is a tiny test of the quick brown fox.",
                                  language="English", ref_text="The quick brown fox.", ref=(0.4, 24000))),
    "base_icl_nonstream": ("base", "voice_clone",
                           dict(text="Hello world.", language="English", ref_text="The quick brown fox.",
                                non_streaming_mode=True, ref=(1.0, 24000))),
    # EOS made likely (its codec_head row scaled up) so generation stops on EOS before max_new_tokens
    "cv_eos": ("custom_voice", "custom_voice",
               dict(text="Hello world.", speaker="Vivian", language="English", eos_boost=6.0)),
    "cv_batch2": ("custom_voice", "custom_voice",
                  dict(text=["Hello world.", "The quick brown fox jumps over the lazy dog."],
                       speaker=["Vivian", "Uncle_Fu"], language=["English", "Auto"])),
}

def build_checkpoints(root: str) -> dict[str, str]:
    from voxflow.tools.tiny_set import write_tiny_set
    return write_tiny_set(root)


def clone(x):
    return x.detach().clone() if torch.is_tensor(x) else x


@contextlib.contextmanager
def spies(model):
    """Record what crosses each boundary of the official pipeline during one generate call."""
    core = model.model
    talker = core.talker
    rec = {"talker_logits": [], "cp_logits": []}
    originals = (talker.generate, core.generate, core.speech_tokenizer.decode)

    def talker_generate(**kw):
        rec["talker_in"] = {k: clone(kw[k]) for k in
                            ("inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed")}
        return originals[0](**kw)

    def core_generate(**kw):
        rec["input_ids"] = [clone(x) for x in kw["input_ids"]]
        rec["instruct_ids"] = [clone(x) for x in (kw.get("instruct_ids") or [])]
        rec["ref_ids"] = [clone(x) for x in (kw.get("ref_ids") or [])]
        vcp = kw.get("voice_clone_prompt")
        if vcp is not None:
            rec["ref_code"] = [clone(x) for x in vcp["ref_code"]]
            rec["ref_spk_embedding"] = [clone(x) for x in vcp["ref_spk_embedding"]]
        codes, hiddens = originals[1](**kw)
        rec["codes"] = [clone(c) for c in codes]
        return codes, hiddens

    def codec_decode(items, *a, **kw):
        rec["decode_codes"] = [clone(it["audio_codes"]) for it in items]
        return originals[2](items, *a, **kw)

    talker.generate, core.generate, core.speech_tokenizer.decode = talker_generate, core_generate, codec_decode
    hooks = [talker.codec_head.register_forward_hook(
        lambda mod, inp, out: rec["talker_logits"].append(out[:, -1].detach().clone()))]
    for j, head in enumerate(talker.code_predictor.lm_head):
        hooks.append(head.register_forward_hook(
            lambda mod, inp, out, j=j: rec["cp_logits"].append((j, out[:, -1].detach().clone()))))
    try:
        yield rec
    finally:
        talker.generate, core.generate, core.speech_tokenizer.decode = originals
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def eos_boost(model, factor):
    """Scale the EOS row of the talker's codec_head (undone afterwards); voxflow's test does the same."""
    if factor is None:
        yield
        return
    weight = model.model.talker.codec_head.weight
    eos = model.model.config.talker_config.codec_eos_token_id
    saved = weight.data[eos].clone()
    weight.data[eos] *= factor
    try:
        yield
    finally:
        weight.data[eos] = saved


def run_case(model, call: str, kw: dict) -> dict:
    kw = dict(kw)
    boost = kw.pop("eos_boost", None)
    gen = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, subtalker_dosample=False)
    ref_audio = None
    with spies(model) as rec, eos_boost(model, boost):
        if call == "custom_voice":
            wavs, sr = model.generate_custom_voice(**kw, **gen)
        elif call == "voice_design":
            wavs, sr = model.generate_voice_design(**kw, **gen)
        else:
            seconds, ref_sr = kw.pop("ref")
            ref_audio = reference_clip(seconds, ref_sr)
            wavs, sr = model.generate_voice_clone(ref_audio=(ref_audio, ref_sr), **kw, **gen)
            kw["ref_sr"] = ref_sr
    out = dict(rec)
    talker_logits = torch.stack(rec["talker_logits"])                              # [S, B, 3072]
    steps = [s for s in TALKER_STEPS_KEPT if s < talker_logits.shape[0]]
    out["talker_logits"] = talker_logits[steps]
    out["talker_steps"] = torch.tensor(steps)
    out["num_talker_steps"] = talker_logits.shape[0]
    cp = rec["cp_logits"]
    assert [j for j, _ in cp] == list(range(15)) * (len(cp) // 15), "unexpected code-predictor call order"
    cp = torch.stack([t for _, t in cp]).view(len(cp) // 15, 15, *cp[0][1].shape)  # [F, 15, B, 2048]
    kept = [f for f in CP_FRAMES_KEPT if f < cp.shape[0]]
    out["cp_logits"] = cp[kept]
    out["cp_frames"] = torch.tensor(kept)
    out["wav"] = [torch.from_numpy(np.asarray(w, dtype=np.float32)) for w in wavs]
    out["sr"] = sr
    if ref_audio is not None:
        out["ref_audio"] = torch.from_numpy(ref_audio)
    out["request"] = kw
    if boost is not None:
        out["request"]["eos_boost"] = boost
    return out


def codec_cases(ckpt_dir: str) -> dict:
    """Codec-only goldens: a long decode (> 300 frames, the official 300/25 windowing) and the encoder."""
    from qwen_tts import Qwen3TTSTokenizer
    tok = Qwen3TTSTokenizer.from_pretrained(os.path.join(ckpt_dir, "speech_tokenizer"), device_map="cpu",
                                            dtype=torch.float32)
    rng = np.random.default_rng(2024)
    frames = 340
    codes = torch.from_numpy(rng.integers(0, 2048, size=(frames, 16))).long()
    wavs, sr = tok.decode([{"audio_codes": codes}])
    wav = torch.from_numpy(np.asarray(wavs[0], dtype=np.float32))
    lo, hi = 280 * 1920, frames * 1920          # keep the region around the first window boundary only
    clip = reference_clip(2.3, 24000, seed=5)
    enc = tok.encode([clip, clip[:24000]], sr=24000)
    return {"codec_long": dict(codes=codes.to(torch.int16), wav_slice=wav[lo:hi].clone(), slice_start=lo,
                               wav_len=wav.numel(), sr=sr),
            "codec_encode": dict(audio=torch.from_numpy(clip),
                                 codes=[c.clone() for c in enc.audio_codes])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers
    from qwen_tts import Qwen3TTSModel

    versions = dict(qwen_tts=importlib.metadata.version("qwen-tts"), transformers=transformers.__version__,
                    torch=torch.__version__)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        paths = build_checkpoints(root)
        models = {}
        for name, (ckpt, call, kw) in CASES.items():
            if args.only and name not in args.only:
                continue
            if ckpt not in models:
                models[ckpt] = Qwen3TTSModel.from_pretrained(paths[ckpt], device_map="cpu", dtype=torch.float32,
                                                             attn_implementation="eager")
            torch.manual_seed(0)
            out = run_case(models[ckpt], call, kw)
            out["meta"] = dict(case=name, checkpoint=ckpt, checkpoint_args=TINY_SET[ckpt], call=call,
                               max_new_tokens=MAX_NEW_TOKENS, greedy=True, attn="eager", versions=versions)
            torch.save(out, os.path.join(args.out, f"{name}.pt"))
            shapes = [tuple(c.shape) for c in out["codes"]]
            print(f"{name}: prompt {tuple(out['talker_in']['inputs_embeds'].shape)} codes {shapes} "
                  f"wav {[w.numel() for w in out['wav']]}", flush=True)
        if not args.only or "codec" in args.only:
            for name, out in codec_cases(paths["custom_voice"]).items():
                out["meta"] = dict(case=name, checkpoint="custom_voice", versions=versions)
                torch.save(out, os.path.join(args.out, f"{name}.pt"))
                print(f"{name}: written", flush=True)


if __name__ == "__main__":
    sys.exit(main())
