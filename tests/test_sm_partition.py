"""codec_sms (engine/sm_partition.py) where there is no GPU: a bad SM count or a CPU codec is refused with a clear
error before or while loading, and the engine-arg reads as a number. The partition itself runs in
tests/gpu/test_gpu_codec.py (needs a CUDA driver)."""
import os

import pytest
import torch

from voxflow.engine.config import EngineConfig
from voxflow.engine.engine import EngineCore
from voxflow.engine.engine_args import parse_engine_args
from voxflow.engine.sm_partition import check_num_sms, partitioned_stream


@pytest.mark.parametrize("bad", [0, -8, True, 1.5, "64"])
def test_bad_sm_counts_are_refused(bad):
    with pytest.raises(ValueError, match="codec_sms must be a positive number"):
        check_num_sms(bad)


def test_a_cpu_device_is_refused():
    with pytest.raises(ValueError, match="partitions a GPU"):
        partitioned_stream(torch.device("cpu"), 16)


def test_engine_with_codec_sms_on_cpu_fails_clearly():
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    with pytest.raises(ValueError, match="partitions a GPU"):
        EngineCore.from_config(EngineConfig(model=model, codec_sms=16,
                                            num_kv_blocks=16))


def test_engine_arg_reads_codec_sms():
    assert parse_engine_args(["codec_sms=96"])["codec_sms"] == 96
