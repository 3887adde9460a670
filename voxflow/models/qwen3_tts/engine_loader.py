"""Qwen3-TTS as an engine model: the batched paged talker plugin and the streaming codec runner.

The codec runner's state pool has one row per engine slot (`max_slots` = the engine's max_num_seqs: a request
keeps its slot while running, prefilling or preempted). A request's codec state outlives its slot until its final
chunk is collected, so a new request's first chunk may find no free row: it then waits (engine/codec_executor.py).
`codec_dtype` is the codec decoder's dtype: "auto" (the default) runs fp16 on a GPU when this checkpoint's decoder
passes codec_precision.py's check against its fp32 decode, else fp32; "float32", "bfloat16", "float16" force one
(each measured against fp32 by `python -m voxflow.tools.codec_snr`; half precision can overflow, spec 10).
`codec_cuda_graphs=False` makes the codec run its steps eagerly on a GPU (no effect on a CPU). `codec_max_batch`
caps how many requests one codec call decodes (bigger groups are split): the codec's activations grow with the
batch (a 64 x 25-frame call holds GBs of upsampled feature maps), so a memory-bound deployment trades a few more
calls for a smaller peak.
`text_embedding_on_host` keeps the talker's text embedding table (594 MiB in bf16) in host memory: prompt builds
gather new ids' rows there (model.py); nothing per step reads it.
`codec_sms` confines the codec stream's kernels to that many SMs of the GPU, or "auto": half of them where
green contexts exist (engine/sm_partition.py). The loader's default, None, is the whole GPU; EngineConfig's is
"auto".
`preload_text_rows` (on a GPU) projects every text token id's prompt row at load (text_rows.py, preload: vocab x
hidden on the device, before the engine sizes its KV pool), so that prompt builds never run the text projection.
`preload_text_ids` (on a GPU, without `preload_text_rows`) projects only the first N ids' rows at load into the rows
kept on first sight (text_rows.py, warm: the BPE's most frequent tokens, N x hidden on the device).
`max_frames` (the engine's max_model_len) sizes the per-slot frame history so that no request the engine accepts
makes it grow while serving (a growth recaptures the decode graphs: slots.py).
"""
from __future__ import annotations

import torch

from voxflow.engine.sm_partition import check_setting
from voxflow.layers import qwen3_layer
from voxflow.layers.cast import cast_parameters
from voxflow.layers.folded_norms import fold_final_norm_in_place, fold_norms_in_place

from . import code_predictor
from .codec_precision import CODEC_DTYPES, resolve_codec_dtype
from .codec_runner import BATCH_BUCKETS, Qwen3CodecRunner
from .model import Qwen3TTS
from .plugin import Qwen3TTSPlugin


def load(path: str, *, device: str = "cpu", dtype: str = "float32", max_slots: int = 32,
         codec_dtype: str = "auto", codec_cuda_graphs: bool = True, codec_max_batch: int | None = None,
         max_frames: int | None = None, text_embedding_on_host: bool = False,
         codec_sms: int | str | None = None, preload_text_rows: bool = False, preload_text_ids: int = 0):
    # The codec loads in fp32 and only the decoder's parameters are cast: the codec ENCODER (voice-clone
    # references) stays fp32 whatever the decoder runs in, and buffers (RoPE frequencies) stay fp32 as in _build.
    if codec_dtype not in CODEC_DTYPES:
        raise ValueError(f"codec_dtype must be one of {', '.join(CODEC_DTYPES)}, got {codec_dtype!r}")
    check_setting(codec_sms)                    # before the load: a bad value fails in a second, not minutes
    model = Qwen3TTS.from_pretrained(path, device=device, dtype=getattr(torch, dtype),
                                     text_embedding_device="cpu" if text_embedding_on_host else None)
    if qwen3_layer.FOLDED_NORMS_PAGED:
        # the talker's fold without folded copies of its weights (folded_norms.fold_norms_in_place; on a CPU only
        # the roundings move: the folded path is the GPU's)
        for layer in model.talker.model.layers:
            fold_norms_in_place(layer)
    if code_predictor.CP_FOLDED_HEAD:
        # the code predictor's final norm into its 15 heads (its draws then scale the logits: CP_FOLDED_HEAD)
        cp = model.talker.code_predictor
        fold_final_norm_in_place(cp.model.norm, cp.lm_head)
    preloaded = None
    if model.talker.device.type == "cuda":
        if preload_text_rows:
            preloaded = model.talker.preload_text_rows()
        elif preload_text_ids:
            preloaded = model.talker.warm_text_rows(preload_text_ids)
    chosen, precision = resolve_codec_dtype(codec_dtype, model.codec_decoder)
    cast_parameters(model.codec_decoder, getattr(torch, chosen))
    buckets = BATCH_BUCKETS
    if codec_max_batch is not None:
        if codec_max_batch < 1:
            raise ValueError(f"codec_max_batch must be >= 1, got {codec_max_batch}")
        buckets = tuple(b for b in BATCH_BUCKETS if b < codec_max_batch) + (codec_max_batch,)
    codec = Qwen3CodecRunner(model, max_rows=max_slots, cuda_graphs=codec_cuda_graphs, batch_buckets=buckets,
                             stream_sms=codec_sms)
    codec.precision = precision                 # how the dtype was chosen: the engine's startup record
    plugin = Qwen3TTSPlugin(model, max_slots=max_slots, max_frames=max_frames)
    plugin.preloaded_text_rows = preloaded          # {bytes, seconds}: the engine's startup record
    return plugin, codec
