"""Find a model's files: a local folder, or a Hugging Face hub id downloaded with huggingface_hub."""
from __future__ import annotations

import os


class ModelNotFoundError(RuntimeError):
    """The model could not be found locally nor fetched from the hub."""


def resolve_model_dir(name_or_path: str, *, revision: str | None = None,
                      allow_patterns: list[str] | None = None) -> str:
    """Return a local folder holding the model.

    A path that exists is used as it is (nothing is fetched). Anything else is treated as a hub id
    ("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"): the cached snapshot is used when present, otherwise it is
    downloaded. Offline or unreachable hubs give an error that names the model.
    """
    expanded = os.path.expanduser(name_or_path)
    if os.path.isdir(expanded):
        return expanded
    if os.path.exists(expanded):
        raise ModelNotFoundError(f"model path '{name_or_path}' is a file; expected a model folder "
                                 "(with config.json) or a hub id like 'Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice'")
    looks_like_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_like_path:
        raise ModelNotFoundError(f"model folder '{name_or_path}' does not exist")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise ModelNotFoundError(f"'{name_or_path}' is not a local folder and huggingface_hub is missing") from e
    try:
        return snapshot_download(repo_id=name_or_path, revision=revision, allow_patterns=allow_patterns)
    except LocalEntryNotFoundError as e:
        raise ModelNotFoundError(
            f"model '{name_or_path}' is not a local folder and could not be reached on the Hugging Face hub "
            f"(offline, or HF_HUB_OFFLINE=1, and not in the local cache): {e}") from None
    except HfHubHTTPError as e:
        raise ModelNotFoundError(f"model '{name_or_path}' could not be fetched from the Hugging Face hub: {e}") from None
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"model '{name_or_path}' could not be reached on the Hugging Face hub: {e}") from None
