"""The API is served through Serve's fast ingress (actors/ingress.py): HAProxy owns the HTTP
and gRPC ports and forwards to the replica's own servers (direct ingress), and Server-Sent
Events and gRPC server streams still stream through it as events are committed."""

from __future__ import annotations

import os

import psutil
from api_harness import SseReader, TenantView
from grpc_harness import GrpcTenant


def _names(pids: set[int]) -> set[str]:
    """The process names of ``pids`` still running (an HAProxy replaced by a reload exits
    once it has handed over its connections)."""
    names = set()
    for pid in pids:
        try:
            names.add(psutil.Process(pid).name())
        except psutil.NoSuchProcess:
            pass
    return names


def _listeners(port: int) -> set[int]:
    return {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid is not None
    }


def _hops(client_port: int, serve_port: int) -> tuple[bool, set[str]]:
    """Whether a HAProxy process holds our client's connection, and the processes that one is
    connected to (by the listening socket at the other end of each of its outgoing
    connections). Any HAProxy process is considered: a reload (replicas changed) starts a new
    one while the old one keeps the connections it holds."""
    haproxy = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "haproxy"}
    listening: dict[int, int] = {}
    holder: int | None = None
    outgoing: list[tuple[int, int]] = []  # (haproxy pid, remote port)
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid is not None:
            listening[c.laddr.port] = c.pid
        elif c.status == psutil.CONN_ESTABLISHED and c.pid in haproxy and c.raddr:
            if c.laddr.port == serve_port and c.raddr.port == client_port:
                holder = c.pid
            elif c.laddr.port != serve_port:
                outgoing.append((c.pid, c.raddr.port))
    upstream = {port for pid, port in outgoing if pid == holder}
    names = set()
    for port in upstream:
        if port in listening:
            try:
                names.add(" ".join(psutil.Process(listening[port]).cmdline()))
            except psutil.NoSuchProcess:
                pass  # gone since: a replica replaced meanwhile
    return holder is not None, names


def test_haproxy_owns_the_http_port_and_forwards_to_the_replica(
    serve_instance: int, t: TenantView
) -> None:
    """The HTTP port is HAProxy's; a live request (an event stream) is held by HAProxy, which
    is connected straight to the API replica's own HTTP server: no Python proxy between."""
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    haproxy = _listeners(serve_instance)
    assert _names(haproxy) == {"haproxy"}
    with t.api.client() as anonymous:
        live = anonymous.get("/health/live")
        assert live.status_code == 200 and live.json()["status"] == "live"  # the app's answer
        unauthorised = anonymous.get("/factory/runs")
        assert unauthorised.status_code == 401
        assert unauthorised.headers["content-type"].startswith("application/problem+json")

    t.publish()
    run_id = t.submit()
    with t.requester().stream("GET", f"/factory/runs/{run_id}/events", timeout=30.0) as response:
        reader = SseReader(response)  # kept: a dropped reader closes the response
        assert reader.read(stop_after=1).events[0].event == "RunAccepted"
        client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        ours, upstream = _hops(client_port, serve_instance)
    assert ours, "HAProxy does not hold the stream's connection"
    assert any("ServeReplica:runcontrol:RunControlApi" in name for name in upstream), upstream
    assert not any("ProxyActor" in name for name in upstream), upstream


def test_events_stream_through_haproxy_as_they_are_committed(t: TenantView) -> None:
    """The first frames arrive while the run is still open (HAProxy does not buffer the
    stream), and the rest follow as the worker commits them."""
    t.publish()
    run_id = t.submit()
    already = t.run(run_id)["lastEventSeq"]
    with t.requester().stream("GET", f"/factory/runs/{run_id}/events", timeout=30.0) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        sse = SseReader(response)
        first = sse.read(stop_after=already)
        assert t.run(run_id)["state"] != "Completed"  # streamed while the run is open
        t.succeed(t.claim(run_id))
        rest = sse.read()
    assert rest.ended
    assert rest.events[-1].event == "RunCompleted"
    seqs = [e.id for e in first.events + rest.events]
    assert seqs == list(range(1, len(seqs) + 1))


def test_grpc_server_streaming_goes_through_haproxy(grpc_port: int, g: GrpcTenant) -> None:
    """The gRPC port is HAProxy's as well, and WatchRun (server streaming) delivers each event
    as it is committed through it: the first frames while the run is still open."""
    assert _names(_listeners(grpc_port)) == {"haproxy"}
    g.view.publish()
    run_id = g.view.submit()
    worker, bff = g.worker(), g.reader()
    stream = bff.watch(run_id)
    first = next(stream)
    assert first.type == "RunAccepted"
    assert g.view.run(run_id)["state"] != "Completed"  # streamed while the run is open
    lease = worker.claimed([g.view.agent], run_id)
    assert worker.report(worker.report_request(lease)).state == "Succeeded"
    rest = list(stream)  # the stream ends by itself after the terminal event
    assert rest and rest[-1].type == "RunCompleted"
    seqs = [e.seq for e in [first, *rest]]
    assert seqs == list(range(1, len(seqs) + 1))
