"""The API process's garbage-collector pauses (GcPauseWatch, voxflow/engine/gc_freeze.py): the watch times each collection by
generation, the server exports them as voxflow_api_gc_pause_seconds, and `voxflow serve`'s uvicorn server freezes
the startup objects out of the collector's scans as it starts (unless --no-gc-freeze)."""
from __future__ import annotations

import argparse
import gc
import re
import time

import httpx
import pytest

from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.gc_freeze import GcPauseWatch, freeze_startup_objects

from test_api_admission import GateEngine
from test_api_speech import ServerThread


@pytest.fixture
def unfrozen():
    """Whatever a test freezes goes back to the collector's generations afterwards (gc.freeze is process-wide)."""
    yield
    gc.unfreeze()


def test_the_watch_times_each_collection_by_generation_until_uninstalled():
    seen: list[tuple[int, float]] = []
    watch = GcPauseWatch(lambda gen, s: seen.append((gen, s)))
    watch.install()
    watch.install()                                      # (twice: still one callback)
    try:
        assert gc.callbacks.count(watch) == 1
        garbage = [[] for _ in range(50_000)]           # something for the full collection to scan
        started = time.perf_counter()
        gc.collect(2)
        took = time.perf_counter() - started
        del garbage
    finally:
        watch.uninstall()
    full = [s for gen, s in seen if gen == 2]
    assert full and 0 < full[-1] <= took
    seen.clear()
    gc.collect(2)
    assert seen == [] and watch not in gc.callbacks


def test_freezing_moves_the_live_objects_out_of_the_scans(unfrozen):
    held = [[] for _ in range(10_000)]                   # tracked containers alive now
    freeze_startup_objects()
    assert gc.get_freeze_count() >= len(held)
    assert all(not any(o is held for o in gc.get_objects(generation)) for generation in range(3))


def pauses(text: str, generation: int) -> int:
    m = re.search(rf'^voxflow_api_gc_pause_seconds_count{{generation="{generation}"}} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else 0


def test_the_server_exports_its_collections_while_it_runs():
    engine = GateEngine()
    app = create_app(engine, ServerSettings(model_name="gate"), model_info=engine.model_info, manage_engine=False)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        before = pauses(c.get("/metrics").text, 2)
        gc.collect(2)
        assert pauses(c.get("/metrics").text, 2) == before + 1
    gc.collect(2)                                        # after the server stopped: no longer watched
    assert not any(isinstance(cb, GcPauseWatch) for cb in gc.callbacks)


def test_serve_freezes_the_startup_objects_as_it_starts_unless_told_not_to(unfrozen, monkeypatch):
    import uvicorn

    from voxflow.api import serve
    from voxflow.api.uvicorn_server import ShutdownAwareServer
    p = argparse.ArgumentParser()
    serve.add_serve_arguments(p)
    assert p.parse_args(["m"]).no_gc_freeze is False and p.parse_args(["m", "--no-gc-freeze"]).no_gc_freeze is True
    engine = GateEngine()
    for freeze in (False, True):
        gc.unfreeze()
        app = create_app(engine, ServerSettings(model_name="gate"), model_info=engine.model_info,
                         manage_engine=False)
        monkeypatch.setattr(uvicorn, "Server", lambda config: ShutdownAwareServer(
            config, app.state.vox.admission, freeze_gc=freeze))
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/health").status_code == 200
            assert isinstance(srv.server, ShutdownAwareServer)
            assert (gc.get_freeze_count() > 0) is freeze


def test_the_summary_reads_the_pauses_of_a_scrape_and_since_an_earlier_one():
    from voxflow.api.metrics import Metrics
    from voxflow.tools.loop_lag import format_gc_pauses
    m = Metrics()
    assert format_gc_pauses(m.render().decode()) == "API GC pauses: none exported (an older server)"
    for generation, seconds in ((0, 0.0003), (0, 0.0004), (2, 0.06), (2, 0.004)):
        m.gc_pause.labels(generation=str(generation)).observe(seconds)
    text = m.render().decode()
    assert format_gc_pauses(text) == ("API GC pauses: generation 0 2 (total 0.7 ms, > 10 ms 0), "
                                      "generation 2 2 (total 64.0 ms, > 10 ms 1)")
    m.gc_pause.labels(generation="2").observe(0.02)
    assert format_gc_pauses(m.render().decode(), since=text) == (
        "API GC pauses: generation 0 0 (total 0.0 ms, > 10 ms 0), generation 2 1 (total 20.0 ms, > 10 ms 1)")
