"""A run host or the scheduler (re)started while PostgreSQL is down waits for it instead of
failing its constructor: Ray restarts an actor that dies, never one whose constructor raised,
and a scheduler lost that way relayed no event again (the chaos run of 2026-12-01: the
scheduler killed, restarted during the database outage that followed, 773 events never
published). Real PostgreSQL, crashed and started again (``chaos_pg``)."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_pg import CrashablePostgres
from sqlalchemy.exc import OperationalError

from runcontrol.bootstrap import build_database
from runcontrol.config import Settings


@pytest.fixture
def postgres() -> Iterator[CrashablePostgres]:
    root = Path(tempfile.mkdtemp(prefix="rc-outage-", dir="/tmp"))
    server = CrashablePostgres(root)
    build_database(Settings(), owner_url=server.owner_url).dispose()  # migrated, as `up` does
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_process_started_during_an_outage_waits_for_the_database(
    postgres: CrashablePostgres,
) -> None:
    postgres.crash()
    back_at: list[float] = []

    def restart_later() -> None:
        time.sleep(2.0)
        postgres.start()
        back_at.append(time.monotonic())

    restarter = threading.Thread(target=restart_later)
    began = time.monotonic()
    restarter.start()
    try:
        db = build_database(
            Settings(),
            owner_url=postgres.owner_url,
            migrate=False,
            require_compatible_schema=True,
            wait_s=60,
        )
    finally:
        restarter.join()
    try:
        assert back_at and time.monotonic() >= back_at[0], "returned before the server was back"
        assert time.monotonic() - began >= 2.0
        assert db.schema_revision() is not None  # connected, at the schema it checked
    finally:
        db.dispose()


@pytest.mark.slow
def test_the_wait_is_bounded_and_then_the_connection_failure_is_raised(
    postgres: CrashablePostgres,
) -> None:
    postgres.crash()
    began = time.monotonic()
    with pytest.raises(OperationalError):
        build_database(
            Settings(),
            owner_url=postgres.owner_url,
            migrate=False,
            require_compatible_schema=True,
            wait_s=1.5,
        )
    assert 1.0 <= time.monotonic() - began < 10
    # without a wait (the CLI's, a replica's), the first failure is the answer
    began = time.monotonic()
    with pytest.raises(OperationalError):
        build_database(
            Settings(), owner_url=postgres.owner_url, migrate=False, require_compatible_schema=True
        )
    assert time.monotonic() - began < 5
