"""Quality checks on generated speech. `asr`: Whisper tiny.en transcription and WER (optional extra
`voxflow[asr]`; importing this package imports neither faster-whisper nor the weights)."""
from .asr import (ASRNotInstalledError, QualityResult, asr_available, load_asr, normalize_text, score, transcribe,
                  wer)

__all__ = ["ASRNotInstalledError", "QualityResult", "asr_available", "load_asr", "normalize_text", "score",
           "transcribe", "wer"]
