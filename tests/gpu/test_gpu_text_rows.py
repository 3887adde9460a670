"""Projected text rows kept per token id (qwen3_tts/text_rows.py), on by default on a GPU: with the tiny talker in
bf16 on CUDA, the prompt builder's rows equal the per-request projection within one bf16 rounding (a kept row
came out of a GEMM over another batch, so only its summation order differs), and repeated ids project nothing."""
import os

import pytest
import torch

from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.prompt import PromptRequest, build_prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def test_gpu_prompt_from_kept_rows_is_within_one_bf16_rounding():
    model = Qwen3TTS.from_pretrained(os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"), device="cuda",
                                     dtype=torch.bfloat16)
    talker = model.talker
    req = PromptRequest(text="Hello there, how are you today?", speaker="vivian", language="english")
    got = build_prompt(model.config, model.tokenizer, talker, req)
    projected = talker._text_rows.projected
    assert projected > 0
    build_prompt(model.config, model.tokenizer, talker, req)
    assert talker._text_rows.projected == projected              # the same text again: all rows kept
    talker.keep_text_rows = False
    want = build_prompt(model.config, model.tokenizer, talker, req)
    a, b = got.inputs_embeds.float(), want.inputs_embeds.float()
    assert a.shape == b.shape
    # one bf16 rounding (2^-8 relative) of each term of the summed rows, with room for the sum's own rounding
    assert (a - b).abs().max() <= 2 ** -7 * b.abs().max()


def test_gpu_engine_preloads_every_text_row_and_serving_projects_none():
    """EngineConfig.preload_text_rows (default on a GPU): the whole vocabulary projected at load (recorded in the
    startup record); the warm-up and a served request project nothing more."""
    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.offline import run_offline
    from voxflow.engine.request import SamplingOptions, SpeechRequest
    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"),
                                               device="cuda", dtype="bfloat16", max_num_seqs=4, num_kv_blocks=64))
    talker = core.model.model.talker
    rows = talker._text_rows
    vocab = talker.model.text_embedding.num_embeddings
    assert rows is not None and rows.preload and rows.projected == vocab
    assert core.startup["preloaded_text_rows"]["bytes"] == vocab * talker.cfg.hidden_size * 2       # bf16
    run_offline(core, [SpeechRequest(text="An entirely new sentence, never seen.", voice="vivian",
                                     sampling=SamplingOptions(greedy=True, max_new_tokens=4))])
    assert talker._text_rows is rows and rows.projected == vocab
