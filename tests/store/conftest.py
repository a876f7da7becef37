"""Store-layer fixtures: a container on the session database (ManualClock) and a helper that
creates a real run through RunGrain, so store tests exercise the rows the grain writes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from uuid import UUID

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from support import SyncGrain, drive, scratch_database

from runcontrol.bootstrap import Container, build
from runcontrol.clock import ManualClock
from runcontrol.commands import AcquireLease, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import LeaseGrant, Principal, Role, StepSpec, WorkflowDefinition
from runcontrol.grain import RunGrain
from runcontrol.store import Database


@dataclass
class LeasedRun:
    tenant: str
    run_id: UUID
    attempt_id: UUID
    grain: SyncGrain  # the activation that made the run: it holds the run cached
    grant: LeaseGrant | None


@pytest.fixture(scope="session")
def owner_engine(owner_url: str, db: Database) -> Iterator[Engine]:
    """The schema owner (a superuser on the embedded server): used only to prove what even the
    owner cannot do, and to inspect the catalog."""
    engine = create_engine(owner_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def fresh_url(owner_url: str, db: Database) -> Iterator[str]:
    """An empty database on the session's server (its roles exist already)."""
    name = f"runcontrol_schema_{uuid.uuid4().hex[:8]}"
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def scratch(owner_url: str) -> Iterator[Database]:
    """A migrated database of its own: for a test that changes a table, or that must find no
    other test's rows or listeners in it."""
    with scratch_database(owner_url) as database:
        yield database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def container(db: Database, clock: ManualClock) -> Iterator[Container]:
    built = build(Settings(), db=db, clock=clock, migrate=False)
    yield built
    drive(built.store.close())


@pytest.fixture
def make_leased_run(container: Container) -> Callable[..., LeasedRun]:
    """``make_leased_run(tenant)``: a Running one-step run whose attempt is leased to worker-1
    (``lease=False``: left Dispatched, ``grant`` is then None)."""
    return lambda tenant, lease=True: _leased_run(container, tenant, lease)


def _leased_run(container: Container, tenant: str, lease: bool) -> LeasedRun:
    env = container.env
    container.releases.publish(
        tenant,
        WorkflowDefinition("wf", (StepSpec(name="only", agent_id="agent-a"),)),
        "publisher",
        env.clock.now(),
    )
    grain = SyncGrain(RunGrain(env, tenant, uuid.uuid4()))
    grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id,
            run_id=grain.run_id,
            principal=Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
            request=SubmitRequest(
                project_id="proj-1",
                idempotency_key=uuid.uuid4().hex,
                workflow_id="wf",
                model_profile_id="code-agent",
                input={"n": 1},
                release_alias="latest",
            ),
        )
    )
    with container.db.tenant(tenant) as conn:
        (attempt_id,) = conn.exec_driver_sql(
            "SELECT attempt_id FROM attempts WHERE run_id = %s", (grain.run_id,)
        ).scalars()
    grant = (
        grain.execute(
            AcquireLease(
                tenant_id=grain.tenant_id,
                run_id=grain.run_id,
                attempt_id=attempt_id,
                holder="worker-1",
            )
        )
        if lease
        else None
    )
    return LeasedRun(tenant, grain.run_id, attempt_id, grain, grant)
