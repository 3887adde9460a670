"""The HTTP / WebSocket front end: OpenAI-compatible speech API, voices, streaming, metrics."""
