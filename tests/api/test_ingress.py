"""The API is served through Serve's fast ingress (actors/ingress.py): HAProxy owns the HTTP
port and forwards to the replica's own HTTP server (direct ingress), and Server-Sent Events
still stream through it frame by frame."""

from __future__ import annotations

import csv
import io
import os
import time

import httpx
import psutil
from api_harness import Api, SseReader, TenantView


def _listener(port: int) -> psutil.Process:
    (pid,) = {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid is not None
    }
    return psutil.Process(pid)


def _sessions_to_replicas() -> int:
    """Sessions HAProxy has opened to Serve's replica servers (its stats page, as CSV)."""
    port = os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]
    page = httpx.get(f"http://127.0.0.1:{port}/stats;csv", timeout=5.0)
    page.raise_for_status()
    rows = csv.DictReader(io.StringIO(page.text.lstrip("# ")))
    return sum(
        int(r["stot"] or 0)
        for r in rows
        if r["svname"] not in ("FRONTEND", "BACKEND") and r["pxname"] not in ("stats",)
    )


def test_haproxy_owns_the_http_port_and_forwards_to_the_app(serve_instance: int, api: Api) -> None:
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert _listener(serve_instance).name() == "haproxy"
    before = _sessions_to_replicas()
    with api.client() as http:
        for _ in range(5):
            live = http.get("/health/live")
            assert live.status_code == 200
            assert live.json()["status"] == "live"  # the app's answer, not HAProxy's
        unknown = http.get("/factory/runs")  # no token: the app's problem+json, via HAProxy
        assert unknown.status_code == 401
        assert unknown.headers["content-type"].startswith("application/problem+json")
    assert _sessions_to_replicas() >= before + 6


def test_events_stream_through_haproxy_as_they_are_committed(t: TenantView) -> None:
    """The first frames arrive while the run is still open (HAProxy does not buffer the
    stream), and the rest follow as the worker commits them."""
    t.publish()
    run_id = t.submit()
    already = t.run(run_id)["lastEventSeq"]
    started = time.monotonic()
    with t.requester().stream("GET", f"/factory/runs/{run_id}/events", timeout=30.0) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        sse = SseReader(response)
        first = sse.read(stop_after=already)
        assert t.run(run_id)["state"] != "Completed"
        assert time.monotonic() - started < 10
        t.succeed(t.claim(run_id))
        rest = sse.read()
    assert rest.ended
    assert rest.events[-1].event == "RunCompleted"
    seqs = [e.id for e in first.events + rest.events]
    assert seqs == list(range(1, len(seqs) + 1))
