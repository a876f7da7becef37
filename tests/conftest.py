"""Shared fixtures: one real PostgreSQL per test session (embedded unless a URL is given).

Tests isolate by tenant: every test gets fresh tenant ids, and row-level security keeps the
tenants apart, so no test truncates tables another might be reading.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from runcontrol import embedded
from runcontrol.store import Database


@pytest.fixture(scope="session")
def owner_url() -> Iterator[str]:
    configured = os.environ.get("RUNCONTROL_DATABASE_URL")
    if configured:
        name = f"runcontrol_test_{uuid.uuid4().hex[:8]}"
        admin = create_engine(configured, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        yield make_url(configured).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
        return
    # Short path: the server's unix socket lives in it and socket paths are limited to ~100 bytes.
    root = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
    try:
        yield embedded.start(os.path.join(root, "pg"), delete_on_exit=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def db(owner_url: str) -> Iterator[Database]:
    database = Database(owner_url, pool_size=8)
    database.migrate()
    yield database
    database.dispose()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"
