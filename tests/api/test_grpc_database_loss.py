"""gRPC: a read whose database connection drops answers UNAVAILABLE (retry), not INTERNAL.

The connections are dropped for real: the Serve replica's pooled connections are terminated
in PostgreSQL (``pg_terminate_backend``), found through the replica process's sockets, so the
next read the replica makes on one of them meets a closed connection.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from typing import Any

import grpc
import psutil
from grpc_harness import GrpcTenant
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from runcontrol.store.database import APP_ROLE

ROUNDS = 10


def _replica_backends() -> set[int]:
    """The PostgreSQL backend pids serving the Serve replicas' connections (a unix socket:
    the server end's peer is a socket of the replica process; ``ss`` pairs the two)."""
    sockets: set[str] = set()
    for process in psutil.process_iter(["cmdline"]):
        if "ServeReplica" not in " ".join(process.info["cmdline"] or ()):
            continue
        fds = f"/proc/{process.pid}/fd"
        for fd in os.listdir(fds):
            with contextlib.suppress(OSError):
                target = os.readlink(f"{fds}/{fd}")
                if target.startswith("socket:["):
                    sockets.add(target[len("socket:[") : -1])
    listing = subprocess.run(["ss", "-xpn"], capture_output=True, text=True, check=True).stdout
    return {
        int(m["pid"])
        for m in _SERVER_END.finditer(listing)
        if m["peer"] in sockets  # the backend's peer is the replica's socket
    }


_SERVER_END = re.compile(
    r"\.s\.PGSQL\.\d+\s+\d+\s+\*\s+(?P<peer>\d+)\s+users:\(\(\"postgres\",pid=(?P<pid>\d+)"
)


def _drop(owner_url: str, backends: set[int]) -> int:
    """Terminate the replica's pooled SQLAlchemy sessions (no application_name: not the
    event feed's LISTEN connection); answers how many."""
    engine = create_engine(owner_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE usename = :role AND application_name = '' AND pid = ANY(:pids)"
                    ),
                    {"role": APP_ROLE, "pids": sorted(backends)},
                ).all()
            )
    finally:
        engine.dispose()


def _first_event(stream: Any) -> grpc.StatusCode | None:
    """None when the stream answers its first event, else the status it failed with."""
    try:
        next(iter(stream))
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    finally:
        stream.cancel()
    return None


def test_a_dropped_database_connection_answers_unavailable(g: GrpcTenant, ray_runtime: Any) -> None:
    g.view.publish()
    run_id = g.view.submit()
    bff = g.reader()
    assert _first_event(bff.watch(run_id)) is None  # the replica has pooled a connection
    owner_url = ray_runtime.owner_url

    failures: list[grpc.StatusCode] = []
    for _ in range(ROUNDS):
        # A probe may meet the dead connection first (the pool then replaces the others):
        # drop again until a WatchRun read is the one that meets it.
        if _drop(owner_url, _replica_backends()) == 0:
            continue
        status = _first_event(bff.watch(run_id))
        if status is not None:
            failures.append(status)
            break
    assert failures == [grpc.StatusCode.UNAVAILABLE]
    # The same call again gets a fresh connection.
    assert _first_event(bff.watch(run_id)) is None
