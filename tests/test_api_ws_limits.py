"""WS /v1/audio/speech/stream under limits and hostile input (routes_ws.py, app.py): sentences wait for the
server-wide concurrency limit instead of being dropped, deeply nested JSON is an ordinary protocol error, API keys
in the URL do not reach the log, the session cap (close 1013) and the Origin check (cross-site WebSocket
hijacking). The harness (fake engine, uvicorn in a thread, a client with timeouts) is test_api_ws.py's.
"""
import asyncio
import contextlib
import json
import logging
import time

import pytest
import websockets
from fastapi.testclient import TestClient

from voxflow.api import app as api_app
from voxflow.api import routes_ws, ws_session
from voxflow.api.app import create_app
from voxflow.api.metrics import Metrics
from voxflow.api.state import ServerSettings

from test_api_ws import HANG, FakeEngine, _metric, _until, check_framing, make_app, run_client, serving

FOUR = "First one. Second one. Third one. Fourth one."


class CountingEngine(FakeEngine):
    """FakeEngine that records how many requests it generates at once (the most ever)."""

    def __init__(self, **kw):
        super().__init__(chunks=4, **kw)
        self.now = self.most = 0

    async def generate(self, request):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            async for out in super().generate(request):
                yield out
        finally:
            self.now -= 1


def metered_app(engine, **settings):
    @contextlib.asynccontextmanager
    async def keep_loop(app):
        app.state.loop = asyncio.get_running_loop()
        yield
    app = make_app(engine, ServerSettings(**settings), lifespan=keep_loop)
    app.state.vox.metrics = Metrics()
    return app


def busy_app():
    """A metered app whose one server-wide slot is held elsewhere (as by an HTTP request) -> (engine, app); the
    slot is taken before the server runs, and given back by `free_the_slot`."""
    engine = FakeEngine()
    app = metered_app(engine, max_concurrent_requests=1)
    assert app.state.vox.admission.try_acquire(1)
    return engine, app


def free_the_slot(app):
    """The other request ends: its slot is given back on the server's loop (admission is not thread-safe)."""
    app.state.loop.call_soon_threadsafe(app.state.vox.admission.release, 1)


def speak(text):
    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm", stream_audio=True)
        await c.send(type="input.text", text=text)
        await c.send(type="input.done")
        return await c.until("session.done")
    return scenario


# ============================================================================== 1. the concurrency limit
def test_busy_server_sentences_wait_for_a_slot_in_order():
    """max_concurrent_requests=2, four sentences at once: the last two used to come back as errors (text lost);
    now each waits for a slot, in sentence order, and never more than 2 generate at once."""
    engine = CountingEngine()
    app = metered_app(engine, max_concurrent_requests=2)
    with serving(app) as url:
        got = run_client(url, speak(FOUR))
        _until(lambda: _metric(app, "voxflow_api_requests_in_flight") == 0)
    sentences = check_framing(got, expect_sentences=4)          # every audio.done has error false
    assert [s["start"]["sentence_text"] for s in sentences] == FOUR.replace(". ", ".|").split("|")
    assert not any(isinstance(m, dict) and m["type"] == "error" for m in got)
    assert engine.most == 2 and engine.finished == [s["start"]["sentence_text"] for s in sentences]
    assert [r.text for r in engine.requests] == engine.finished          # admitted in sentence order
    assert _metric(app, "voxflow_requests_rejected_total", reason="concurrency") == 0
    assert _metric(app, "voxflow_requests_total", status="200") == 4
    assert _metric(app, "voxflow_api_requests_in_flight") == 0 and app.state.vox.admission.running == 0


def test_sentence_waits_for_slots_held_by_other_requests():
    """Every slot is held elsewhere (as by an HTTP request): the sentence waits, and generates once the slot is
    given back (the admission queue hands it over: nothing polls)."""
    engine, app = busy_app()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm")
        await c.send(type="input.text", text="Hello there.")
        await c.send(type="input.done")
        deadline = time.monotonic() + HANG
        while _metric(app, "voxflow_api_requests_waiting") != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert _metric(app, "voxflow_api_requests_waiting") == 1
        await asyncio.sleep(0.2)
        assert engine.requests == []                            # still waiting for the slot
        assert _metric(app, "voxflow_api_requests_in_flight") == 1      # the other request only
        free_the_slot(app)
        return await c.until("session.done")

    with serving(app) as url:
        got = run_client(url, scenario)
    check_framing(got, expect_sentences=1, streamed=False)
    assert _metric(app, "voxflow_requests_rejected_total", reason="concurrency") == 0
    assert _metric(app, "voxflow_requests_total", status="200") == 1


def test_sentence_refused_after_the_bounded_wait(monkeypatch):
    """The wait is bounded: a sentence that gets no slot in ADMIT_WAIT_S ends with an error, counted once as a
    rejection (as a 429), not as a request; the sentence after it still plays."""
    monkeypatch.setattr(ws_session, "ADMIT_WAIT_S", 0.3)
    engine, app = busy_app()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm")
        await c.send(type="input.text", text="Lost one.")
        await c.send(type="input.done")
        got = await c.until("session.done")
        free_the_slot(app)
        await c.send(type="input.text", text="Second try.")
        await c.send(type="input.done")
        return got, await c.until("session.done")

    with serving(app) as url:
        refused, ok = run_client(url, scenario)
        _until(lambda: _metric(app, "voxflow_api_requests_in_flight") == 0)
    assert [m["type"] for m in refused] == ["audio.start", "error", "audio.done", "session.done"]
    assert "too many concurrent requests" in refused[1]["message"] and refused[2]["error"] is True
    check_framing(ok, expect_sentences=1, streamed=False)
    assert _metric(app, "voxflow_requests_rejected_total", reason="concurrency") == 1
    assert _metric(app, "voxflow_requests_total", status="200") == 1
    assert _metric(app, "voxflow_requests_total", status="500") == 0
    assert _metric(app, "voxflow_api_requests_in_flight") == 0


def test_queued_sentences_share_one_bounded_wait(monkeypatch):
    """The wait counts from each sentence's acceptance, not from its turn: six sentences queued behind a busy
    server are all refused about ADMIT_WAIT_S after they came, not six waits one after the other (the session, its
    slot and its idle timer were held that long)."""
    import time
    monkeypatch.setattr(ws_session, "ADMIT_WAIT_S", 0.5)
    engine, app = busy_app()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm")
        started = time.monotonic()
        await c.send(type="input.text", text="One here. Two here. Three here. Four here. Five here. Six here.")
        await c.send(type="input.done")
        got = await c.until("session.done")
        return got, time.monotonic() - started

    with serving(app) as url:
        got, took = run_client(url, scenario)
    assert sum(m["type"] == "audio.done" and m["error"] for m in got) == 6
    assert took < 2.0, took                 # one shared 0.5 s wait, not 6 x 0.5 s in a row
    assert _metric(app, "voxflow_requests_rejected_total", reason="concurrency") == 6


# ============================================================================== 2. deeply nested JSON
def test_deeply_nested_json_is_a_protocol_error():
    engine = FakeEngine()
    deep = "[" * 3000 + "]" * 3000

    async def scenario(c):
        errors = []
        await c.ws.send(deep)                                   # before session.config
        errors.append(await c.recv_json())
        await c.send(type="session.config", voice="vivian", response_format="pcm")
        await c.ws.send(deep)
        errors.append(await c.recv_json())
        await c.ws.send('{"type": "input.text", "text": ' + "{\"a\": " * 3000 + "1" + "}" * 3000 + "}")
        errors.append(await c.recv_json())
        await c.send(type="input.text", text="Still here.")
        await c.send(type="input.done")
        return errors, await c.until("session.done")

    with serving(make_app(engine)) as url:
        errors, rest = run_client(url, scenario)
    assert all(e["type"] == "error" and "invalid JSON" in e["message"] for e in errors), errors
    check_framing(rest, expect_sentences=1, streamed=False)


# ============================================================================== 3. API keys in the log
def test_filter_redacts_keys_in_uvicorn_records():
    from uvicorn.logging import AccessFormatter
    ws = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
                           ("127.0.0.1:5000", "/v1/audio/speech/stream?api_key=sk-test&x=1"), None)
    access = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", "/v1/models?access_token=tok%2F1&Api%5FKey=k2", "1.1",
                                200), None)
    f = api_app.RedactSecretsFilter()
    assert f.filter(ws) and f.filter(access)
    assert ws.getMessage() == '127.0.0.1:5000 - "WebSocket /v1/audio/speech/stream?api_key=***&x=1" [accepted]'
    line = AccessFormatter(fmt="%(request_line)s %(status_code)s", use_colors=False).format(access)
    assert line == "GET /v1/models?access_token=***&Api%5FKey=*** HTTP/1.1 200 OK"
    assert api_app.redact_secrets("/v1/x?voice=alloy&token=") == "/v1/x?voice=alloy&token=***"
    assert api_app.redact_secrets("no query here") == "no query here"
    kept = "/v1/x?max_new_tokens=8&tokenizer=t&author=me&keyboard=k&monkey=m"          # not secrets: kept
    assert api_app.redact_secrets(kept) == kept
    assert (api_app.redact_secrets("/v1/x?key=a&x-auth=b&client_secret=c")
            == "/v1/x?key=***&x-auth=***&client_secret=***")


def test_api_key_in_the_url_is_not_logged():
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(api_keys=("sk-test",)), model_info=engine.model_info,
                     manage_engine=False)
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    async def scenario(url):
        async with websockets.connect(url + "?api_key=sk-test", open_timeout=HANG) as ws:
            await ws.send(json.dumps({"type": "session.close"}))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), HANG)

    with serving(app) as url:                      # (create_app put the filter; uvicorn's log setup kept it)
        logger, handler = logging.getLogger("uvicorn.error"), Keep()
        level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            asyncio.run(scenario(url))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    accepted = [r for r in records if "[accepted]" in r]
    assert accepted and "api_key=***" in accepted[0], records
    assert not any("sk-test" in r for r in records), records
    api_app.install_log_redaction()                                   # again: idempotent
    assert sum(isinstance(f, api_app.RedactSecretsFilter) for f in logger.filters) == 1


# ============================================================================== 4. the session cap
def test_sessions_beyond_the_cap_are_closed_with_1013():
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(max_ws_sessions=2), model_info=engine.model_info, manage_engine=False)

    async def scenario(url):
        cfg = json.dumps({"type": "session.config", "voice": "vivian"})
        first = [await websockets.connect(url, open_timeout=HANG) for _ in range(2)]
        for ws in first:
            await ws.send(cfg)
        extra = await websockets.connect(url, open_timeout=HANG)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(extra.recv(), HANG)
        await first[0].close()
        _until(lambda: app.state.vox.extra["ws_sessions"] == 1)
        async with websockets.connect(url, open_timeout=HANG) as again:    # a place is free again
            await again.send(json.dumps({"type": "bogus"}))
            reply = json.loads(await asyncio.wait_for(again.recv(), HANG))
        await first[1].close()
        return closed.value.rcvd, reply

    with serving(app) as url:
        rcvd, reply = asyncio.run(scenario(url))
        _until(lambda: app.state.vox.extra["ws_sessions"] == 0)
    assert rcvd.code == 1013 and "too many WebSocket sessions" in rcvd.reason
    assert reply["type"] == "error" and "bogus" in reply["message"]
    assert app.state.vox.extra["ws_sessions"] == 0
    assert _metric(app, "voxflow_requests_rejected_total", reason="ws_sessions") == 1


# ============================================================================== 5. the Origin check
def test_origin_allowed_rules():
    origin_allowed = routes_ws.origin_allowed

    def scope(host, origin=None):
        headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin is not None else [])
        return {"headers": headers}
    assert origin_allowed(scope("127.0.0.1:8000"))                                          # no Origin
    assert origin_allowed(scope("127.0.0.1:8000", "http://127.0.0.1:8000"))
    assert origin_allowed(scope("Example.com", "https://example.com"))                      # default ports
    assert origin_allowed(scope("example.com:443", "https://example.com/"))
    assert origin_allowed(scope("[::1]:8000", "http://[::1]:8000"))
    assert not origin_allowed(scope("127.0.0.1:8000", "http://127.0.0.1:8001"))
    assert not origin_allowed(scope("127.0.0.1:8000", "http://evil.example"))
    assert not origin_allowed(scope("127.0.0.1:8000", "null"))
    assert not origin_allowed(scope("127.0.0.1:8000", "http://127.0.0.1:99999"))           # malformed port
    assert not origin_allowed(scope("example.com", "http://example.com:443"))
    assert origin_allowed(scope("127.0.0.1:8000", "http://App.example:3000/"), ("http://app.example:3000",))
    assert origin_allowed(scope("127.0.0.1:8000", "null"), ("*",))


def test_cross_site_handshake_is_refused():
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(allowed_origins=("http://app.example:3000",)),
                     model_info=engine.model_info, manage_engine=False)

    async def attempt(url, origin):
        try:
            async with websockets.connect(url, origin=origin, open_timeout=HANG) as ws:
                await ws.send(json.dumps({"type": "bogus"}))
                return json.loads(await asyncio.wait_for(ws.recv(), HANG))["type"]
        except websockets.InvalidStatus as e:
            return e.response.status_code

    with serving(app) as url:
        own = "http://" + url.split("/")[2]
        got = {o: asyncio.run(attempt(url, o)) for o in (None, own, "http://app.example:3000", "http://evil.example",
                                                          "null")}
    assert got == {None: "error", own: "error", "http://app.example:3000": "error", "http://evil.example": 403,
                   "null": 403}
    assert engine.requests == []


def test_serve_options():
    import argparse

    from voxflow.api.serve import add_serve_arguments, settings_from_args
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    args = p.parse_args(["m", "--max-ws-sessions", "8", "--allowed-origins", "http://a:1,http://b", "http://c"])
    assert args.max_ws_sessions == 8 and args.allowed_origins == ["http://a:1,http://b", "http://c"]
    assert p.parse_args([]).max_ws_sessions == 256
    settings = settings_from_args(args)             # the comma- and space-separated origins, one tuple
    assert settings.max_ws_sessions == 8 and settings.allowed_origins == ("http://a:1", "http://b", "http://c")


# ============================================================================== 6. DNS rebinding: Host names
def test_only_allowed_host_names_are_served():
    """ServerSettings.allowed_hosts: a request (HTTP or WebSocket) whose Host is another name, as a DNS-rebinding
    page's requests carry, gets 400 before anything else; the allowed names are served; "*" serves any."""
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(allowed_hosts=("localhost", "127.0.0.1", "[::1]")),
                     model_info=engine.model_info, manage_engine=False)
    with TestClient(app) as c:
        assert c.get("/v1/models", headers={"host": "evil.example:8000"}).status_code == 400
        for host in ("127.0.0.1:8000", "localhost", "[::1]:8000"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
        from starlette.testclient import WebSocketDenialResponse
        with pytest.raises(WebSocketDenialResponse) as denied:
            with c.websocket_connect("/v1/audio/speech/stream", headers={"host": "evil.example:8000"}):
                pass
        assert denied.value.status_code == 400
        with c.websocket_connect("/v1/audio/speech/stream", headers={"host": "localhost:8000"}) as ws:
            ws.send_json({"type": "bogus"})
            assert ws.receive_json()["type"] == "error"
    open_app = create_app(engine, ServerSettings(), model_info=engine.model_info, manage_engine=False)
    with TestClient(open_app) as c:
        assert c.get("/v1/models", headers={"host": "evil.example:8000"}).status_code == 200


def test_serve_allows_loopback_names_on_a_loopback_bind_only():
    import argparse

    from voxflow.api.serve import LOOPBACK_HOSTS, add_serve_arguments, settings_from_args
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    assert settings_from_args(p.parse_args(["m"])).allowed_hosts == LOOPBACK_HOSTS       # --host 127.0.0.1
    assert settings_from_args(p.parse_args(["m", "--host", "::1"])).allowed_hosts == LOOPBACK_HOSTS
    assert settings_from_args(p.parse_args(["m", "--host", "0.0.0.0"])).allowed_hosts == ("*",)
    args = p.parse_args(["m", "--allowed-hosts", "tts.example.com,LOCALHOST", "10.0.0.5"])
    assert settings_from_args(args).allowed_hosts == ("tts.example.com", "localhost", "10.0.0.5")


# ============================================================================== 7. cancelled while ending
@pytest.mark.parametrize("in_flight", [False, True], ids=["idle", "sentence_in_flight"])
def test_session_cancelled_while_ending_raises_its_own_cancellation(in_flight):
    """The server may cancel the handler at any moment after the client's close: Starlette's TestClient does, from an
    anyio cancel scope, right after sending websocket.disconnect, without waiting for the handler to return. Landing
    while the session tore down (asyncio.gather of its tasks, one loop iteration or two), that cancellation came out
    as the CancelledError of a task the session had cancelled itself, which the scope did not take for its own and
    let escape: `with client.websocket_connect(...)` then failed, at random, with concurrent.futures.CancelledError.
    Here the cancellation lands at each loop iteration in turn after the close; the handler must end as its own."""
    import anyio
    engine = FakeEngine()
    app = make_app(engine)
    path = "/v1/audio/speech/stream"
    scope = {"type": "websocket", "path": path, "raw_path": path.encode(), "root_path": "", "scheme": "ws",
             "query_string": b"", "headers": [(b"host", b"localhost:8000")], "client": ("127.0.0.1", 50000),
             "server": ("localhost", 8000), "subprotocols": [], "state": {}, "extensions": {}}

    async def session(delay):
        inbox, outbox, scopes = asyncio.Queue(), asyncio.Queue(), []

        async def until(kind):
            while True:
                message = await asyncio.wait_for(outbox.get(), HANG)
                assert message["type"] in ("websocket.accept", "websocket.send"), message
                if message["type"] == "websocket.accept" or json.loads(message.get("text") or "{}").get("type") == kind:
                    return

        async def handler():                    # as the TestClient runs it
            with anyio.CancelScope() as cs:
                scopes.append(cs)
                await app(dict(scope), inbox.get, outbox.put)
                await anyio.sleep_forever()     # until cancelled

        def client_says(**msg):
            inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(msg)})

        task = asyncio.create_task(handler())
        inbox.put_nowait({"type": "websocket.connect"})
        await until("accept")
        if in_flight:
            client_says(type="session.config", voice="vivian", response_format="pcm", stream_audio=True)
            client_says(type="input.text", text="HOLD this one.")
            client_says(type="input.done")
            await until("audio.start")
        else:
            client_says(type="bogus")
            await until("error")
        inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        for _ in range(delay):
            await asyncio.sleep(0)
        scopes[0].cancel()
        await asyncio.wait({task}, timeout=HANG)
        return "escaped" if task.cancelled() else task.result()

    async def every_delay():
        outcomes = {delay: await session(delay) for delay in range(40)}
        await asyncio.sleep(0.1)                # the last session's sentence is aborted, if not already
        return outcomes

    assert asyncio.run(every_delay()) == {delay: None for delay in range(40)}
    assert app.state.vox.extra["ws_sessions"] == 0
    if in_flight:
        assert len(engine.requests) == len(engine.aborted) == 40       # every held sentence aborted in the engine
