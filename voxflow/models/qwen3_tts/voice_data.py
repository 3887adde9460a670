"""A voice-clone prompt as plain data and back (`qwen3_tts.voice.v1`: base64 little-endian arrays that survive JSON
and msgpack): what `POST /v1/audio/voices` stores and what a request's `voice_clone_prompt` carries to the engine
process; and the raw reference clip a request may send instead (float32 PCM bytes)."""
from __future__ import annotations

import base64
import binascii

import numpy as np
import torch

from voxflow.engine.host_to_device import to_device

from .generate import VoiceClonePrompt
from .position_keys import content_key


def pcm_f32(raw: bytes) -> np.ndarray:
    """A request's reference clip (float32 little-endian PCM bytes) as samples; ValueError when it is not one."""
    if not isinstance(raw, (bytes, bytearray, memoryview)) or len(raw) % 4:
        raise ValueError("ref_audio must be float32 little-endian PCM bytes (a multiple of 4 bytes)")
    audio = np.frombuffer(bytes(raw), dtype="<f4").astype(np.float32)
    if audio.size == 0 or not np.isfinite(audio).all():
        raise ValueError("ref_audio is empty or holds non-finite samples")
    return audio


def voice_to_data(clone: VoiceClonePrompt) -> dict:
    """A voice-clone prompt as plain data (base64 little-endian arrays) that survives JSON and msgpack."""
    x = clone.x_vector.detach().float().cpu().numpy().astype("<f4")
    data = {"format": "qwen3_tts.voice.v1", "x_vector": base64.b64encode(x.tobytes()).decode(),
            "dim": int(x.shape[0]), "ref_text": clone.ref_text, "ref_codes": None, "frames": 0}
    if clone.ref_codes is not None:
        codes = clone.ref_codes.detach().cpu().numpy().astype("<i2")
        data.update(ref_codes=base64.b64encode(codes.tobytes()).decode(), frames=int(codes.shape[0]))
    return data


def voice_from_data(data: dict, device, dtype, codebook_size: int = 2048) -> VoiceClonePrompt:
    try:
        if data.get("format") != "qwen3_tts.voice.v1":
            raise ValueError(f"unsupported voice format {data.get('format')!r}")
        x = np.frombuffer(base64.b64decode(data["x_vector"]), dtype="<f4")
        if x.shape[0] != int(data["dim"]):
            raise ValueError("x-vector size does not match its header")
        codes = None
        if data.get("ref_codes"):
            codes = np.frombuffer(base64.b64decode(data["ref_codes"]), dtype="<i2").reshape(int(data["frames"]), 16)
            if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= codebook_size):   # on the host
                raise ValueError(f"reference codes outside [0, {codebook_size}): [{int(codes.min())}, "
                                 f"{int(codes.max())}]")
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise ValueError(f"voice_clone_prompt is not a valid stored voice: {e}") from None
    key = content_key(("stored", x.tobytes(), None if codes is None else codes.tobytes()))
    # Non-blocking copies (host_to_device.py): this runs on the engine thread while a decode step is in flight.
    x_vector = to_device(torch.from_numpy(x.copy()), device, dtype)
    ref_codes = None if codes is None else to_device(torch.from_numpy(codes.astype(np.int64)), device)
    return VoiceClonePrompt(x_vector=x_vector, ref_codes=ref_codes, ref_text=data.get("ref_text"), key=key,
                            codes_checked=True)
