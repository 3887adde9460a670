"""The API process's event-loop lag (voxflow/api/loop_lag.py): the watcher reports a blocked loop, the server
exports it as voxflow_api_event_loop_lag_seconds (or runs no watcher when it is off), and `voxflow serve` takes
its period in milliseconds."""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx
import pytest

from voxflow.api.app import create_app
from voxflow.api.loop_lag import watch_loop_lag
from voxflow.api.state import ServerSettings
from voxflow.tools.loop_lag import format_lag, lag_histogram

from test_api_admission import GateEngine
from test_api_speech import ServerThread

LAG = "voxflow_api_event_loop_lag_seconds"


def test_the_watcher_reports_how_long_the_loop_was_blocked():
    async def main():
        lags: list[float] = []
        watcher = asyncio.ensure_future(watch_loop_lag(lags.append, 0.005))
        deadline = time.monotonic() + 30
        while len(lags) < 2:            # (a loaded machine may merge the first wake-ups into one loop turn)
            assert time.monotonic() < deadline, "the watcher observed nothing"
            await asyncio.sleep(0.01)
        seen = len(lags)
        time.sleep(0.1)                 # the loop is blocked: the pending wake-up comes ~95 ms late
        await asyncio.sleep(0.03)
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
        return seen, lags
    seen, lags = asyncio.run(main())
    assert seen >= 2 and all(lag >= 0 for lag in lags)
    assert max(lags[seen:]) >= 0.09, lags


def test_a_period_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        asyncio.run(watch_loop_lag(lambda lag: None, 0))


class LoopEngine(GateEngine):
    """GateEngine that remembers the loop it is asked about (health: every /metrics scrape)."""

    async def health(self, timeout=None):
        self.loop = asyncio.get_running_loop()
        return await super().health(timeout)


def lag_samples(c: httpx.Client) -> tuple[int, int]:
    """(observations, observations over 50 ms) of the lag histogram on /metrics (voxflow/tools/loop_lag.py)."""
    count, _, buckets = lag_histogram(c.get("/metrics").text)
    return count, count - buckets.get(0.05, 0)


def test_the_server_exports_the_loop_lag_and_a_blocked_loop_shows_in_it():
    engine = LoopEngine()
    app = create_app(engine, ServerSettings(model_name="gate", loop_lag_interval_s=0.005),
                     model_info=engine.model_info, manage_engine=False)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        count, slow = lag_samples(c)
        deadline = time.monotonic() + 30
        while count < 3:                # the watcher runs from startup on
            assert time.monotonic() < deadline, "no loop-lag observation"
            time.sleep(0.02)
            count, slow = lag_samples(c)
        before = slow                   # (startup on a loaded machine may have been slow already)
        engine.loop.call_soon_threadsafe(time.sleep, 0.1)         # block the server's loop for 100 ms
        deadline = time.monotonic() + 30
        while slow == before:
            assert time.monotonic() < deadline, "the blocked loop did not show as lag over 50 ms"
            time.sleep(0.02)
            count, slow = lag_samples(c)


def test_with_the_watcher_off_nothing_is_observed():
    engine = LoopEngine()
    app = create_app(engine, ServerSettings(model_name="gate", loop_lag_interval_s=0),
                     model_info=engine.model_info, manage_engine=False)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        time.sleep(0.1)
        assert lag_samples(c) == (0, 0)
        assert "no observations" in format_lag(c.get("/metrics").text)


def test_the_summary_reads_the_histogram_of_a_scrape():
    from voxflow.api.metrics import Metrics
    m = Metrics()
    for lag in (0.0005, 0.0015, 0.003, 0.03):
        m.loop_lag.observe(lag)
    text = m.render().decode()
    count, total, buckets = lag_histogram(text)
    assert (count, buckets[0.001], buckets[0.002], buckets[0.005], buckets[0.05]) == (4, 1, 2, 3, 4)
    assert total == pytest.approx(0.035)
    assert format_lag(text) == ("event-loop lag: 4 wake-ups, mean 8.75 ms; late by > 1 ms 75.0%, > 2 ms 50.0%, "
                                "> 5 ms 25.0%, > 10 ms 25.0%, > 20 ms 25.0%, > 50 ms 0.0%")
    # since an earlier scrape: only what came after it
    for lag in (0.015, 0.0001):
        m.loop_lag.observe(lag)
    assert format_lag(m.render().decode(), since=text) == (
        "event-loop lag: 2 wake-ups, mean 7.55 ms; late by > 1 ms 50.0%, > 2 ms 50.0%, > 5 ms 50.0%, > 10 ms 50.0%, "
        "> 20 ms 0.0%, > 50 ms 0.0%")


def test_serve_takes_the_period_in_milliseconds_and_refuses_a_negative_one(capsys):
    from voxflow.api import serve
    model = os.path.join(os.environ.get("VOXFLOW_TINY_DIR", "/nonexistent"), "custom_voice")
    p = argparse.ArgumentParser()
    serve.add_serve_arguments(p)
    assert serve.settings_from_args(p.parse_args([model])).loop_lag_interval_s == pytest.approx(0.01)
    assert serve.settings_from_args(p.parse_args([model, "--loop-lag-interval-ms", "25"])).loop_lag_interval_s \
        == pytest.approx(0.025)
    assert serve.settings_from_args(p.parse_args([model, "--loop-lag-interval-ms", "0"])).loop_lag_interval_s == 0
    for bad in ("-1", "nan", "inf", "0.5", "soon"):
        with pytest.raises(SystemExit):
            p.parse_args([model, "--loop-lag-interval-ms", bad])
        assert "--loop-lag-interval-ms" in capsys.readouterr().err
