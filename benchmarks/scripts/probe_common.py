"""What the session-20 probes share: an engine from KEY=VALUE engine args, and N identical requests long enough not
to finish while a probe looks (imported by the scripts beside it, run as `python benchmarks/scripts/NAME.py`)."""
from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import SamplingOptions, SpeechRequest

TEXT = "Hello there, this is a sentence of ordinary length."


def build_engine(model: str, concurrency: int, engine_args: list[str], device: str = "cuda") -> EngineCore:
    """bf16 on a GPU, fp32 on a CPU, max_num_seqs = concurrency, then the engine args."""
    cfg = dict(model=model, device=device, dtype="bfloat16" if device == "cuda" else "float32",
               max_num_seqs=concurrency)
    cfg.update(parse_engine_args(engine_args))
    return EngineCore.from_config(EngineConfig(**cfg))


def add_requests(core: EngineCore, n: int, max_new_tokens: int) -> None:
    for i in range(n):
        core.add_request(SpeechRequest(text=TEXT, voice="vivian", request_id=str(i),
                                       sampling=SamplingOptions(max_new_tokens=max_new_tokens, ignore_eos=True)))
