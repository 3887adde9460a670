"""What every route needs, kept on `app.state.vox`: the engine client, settings, metrics, voices, model info."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from .admission import Admission
from .loop_lag import DEFAULT_INTERVAL_S


@dataclass
class ServerSettings:
    model_name: str = "voxflow"                      # the id clients send as `model` (also served as its basename)
    api_keys: tuple[str, ...] = ()                   # empty: no auth
    voices_dir: str | None = None                    # persistent uploaded voices (None: in memory only)
    allowed_local_media_path: str | None = None      # ref_audio may name files under this folder only
    allowed_media_domains: tuple[str, ...] = ()      # ref_audio URLs only from these hosts (empty: no URLs)
    max_input_chars: int = 4096
    max_instructions_chars: int = 4096
    max_body_bytes: int = 32 * 1024 * 1024
    max_ref_audio_bytes: int = 10 * 1024 * 1024
    max_ref_audio_seconds: float = 30.0
    min_ref_audio_seconds: float = 0.5
    max_new_tokens_limit: int = 8192                 # serve --max-new-tokens-limit; set lower, it also caps the
                                                     # requests that name no max_new_tokens (plan_speech)
    max_concurrent_requests: int = 256               # speech requests running at once (admission.py)
    # How long an HTTP request (a batch's first item too) waits in the admission queue for a slot before its 429
    # with Retry-After; 0: refused at once when no slot is free or others are queued. A batch's later items wait
    # without a deadline (routes_batch.py); WebSocket sentences ws_session.ADMIT_WAIT_S (they cannot be retried).
    admission_wait_s: float = 5.0
    # Requests queued (a batch queues its items one at a time) beyond which an HTTP request is refused at once;
    # WebSocket sentences are never refused for it (bounded by max_ws_sessions x ws_session.MAX_IN_FLIGHT), nor a
    # batch's later items (its first one was admitted).
    max_queued_requests: int = 2048
    max_batch_items: int = 32                        # items of one POST /v1/audio/speech/batch (vLLM-Omni: 32)
    # All of a batch's inputs together: its JSON answer holds every item's audio at once (base64 wav: ~64 KB per
    # second of speech, ~15 characters), so the whole batch is bounded, not only each input.
    max_batch_input_chars: int = 32768
    ws_idle_timeout_s: float = 60.0
    ws_max_text_chars: int = 100_000
    # Host headers served ("*": any). `voxflow serve` on a loopback address allows only loopback names: a web page
    # whose domain an attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin to the browser, and without
    # an API key it could otherwise drive the server; its requests carry the attacker's host name.
    allowed_hosts: tuple[str, ...] = ("*",)
    max_ws_sessions: int = 256                       # WebSocket sessions open at once; beyond: closed with 1013
    allowed_origins: tuple[str, ...] = ()            # browser origins besides the server's own that may open a
                                                     # WebSocket ("*": any); the Origin check of routes_ws.py
    default_voice: str | None = None                 # used when a request names an OpenAI voice the model lacks
    trace_requests: str | None = None                # append one JSON line per speech request (request_trace.py)
    loop_lag_interval_s: float = DEFAULT_INTERVAL_S  # the event loop's lag metric's timer (loop_lag.py); 0: off


@dataclass
class AppState:
    engine: Any                                      # voxflow.engine.client.EngineClient
    settings: ServerSettings
    model_info: dict                                 # engine.model_info: name, task, sample_rate, voices, languages
    metrics: Any = None                              # voxflow.api.metrics.Metrics
    voices: Any = None                               # voxflow.api.voices.VoiceStore
    extra: dict = field(default_factory=dict)
    admission: Admission | None = None               # made from the settings when not given
    request_trace: Any = None                        # request_trace.RequestTrace while the app runs, with
                                                     # settings.trace_requests

    def __post_init__(self) -> None:
        if self.admission is None:
            self.admission = Admission(self.settings.max_concurrent_requests, self.settings.max_queued_requests,
                                       on_change=self._admission_changed)

    def _admission_changed(self, admission: Admission) -> None:
        # self.metrics is looked up at each change: tests (and apps) may attach a Metrics after the state is made
        if self.metrics is not None:
            self.metrics.observe_admission(admission)


def get_state(request: Request) -> AppState:
    return request.app.state.vox
