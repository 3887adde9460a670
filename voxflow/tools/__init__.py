"""Developer tools (tiny random checkpoints in the real Qwen3-TTS layout, ...)."""
