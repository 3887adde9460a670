"""`speaker_embedding` on a voice-clone model: a precomputed x-vector gives the audio of the x-vector-only clone
of the clip it came from; a wrong size is a 400 naming the field."""
import base64
import io
import os

import numpy as np
import soundfile as sf
from fastapi.testclient import TestClient

from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.inprocess import InProcessEngineClient


def test_speaker_embedding_equals_x_vector_only_clone():
    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "base"),
                                               max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=128,
                                               block_size=4))
    t = np.arange(24000) / 24000
    clip = (0.2 * np.sin(2 * np.pi * 190 * t)).astype(np.float32)
    voice = core.create_voice(clip.tobytes(), None, True)
    x_vector = np.frombuffer(base64.b64decode(voice["x_vector"]), "<f4").tolist()
    wav = io.BytesIO()
    sf.write(wav, clip, 24000, format="WAV", subtype="FLOAT")
    data_uri = "data:audio/wav;base64," + base64.b64encode(wav.getvalue()).decode()
    app = create_app(InProcessEngineClient(core), ServerSettings())
    common = {"input": "Hello world.", "response_format": "pcm", "max_new_tokens": 8, "greedy": True}
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 200
        by_embedding = client.post("/v1/audio/speech", json={**common, "speaker_embedding": x_vector})
        by_clip = client.post("/v1/audio/speech", json={**common, "ref_audio": data_uri, "x_vector_only_mode": True})
        assert by_embedding.status_code == by_clip.status_code == 200, (by_embedding.text, by_clip.text)
        a = np.frombuffer(by_embedding.content, "<i2").astype(int)
        b = np.frombuffer(by_clip.content, "<i2").astype(int)
        assert a.shape == b.shape == (7 * 1920,)
        assert np.abs(a - b).max() <= 1
        bad = client.post("/v1/audio/speech", json={**common, "speaker_embedding": x_vector[:-1]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "speaker_embedding"
