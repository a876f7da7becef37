"""The fence of a shard's move on the writes that are not documents (migration 0040,
``runcontrol_fenced_write``): a fenced tenant's release, alias, policy, schedule, webhook
subscription, template or rate bucket write is refused in its own transaction (``ShardMoved``,
retryable) and stores nothing; another tenant's goes through; the fence waits for such a write
in flight; the scheduler's sweep goes on with the other tenants' schedules."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool
from support import drive, subscribe

from runcontrol import cli
from runcontrol import schedules as rules
from runcontrol.domain import Principal, Role, StepSpec, WorkflowDefinition, errors
from runcontrol.domain.rates import Draw
from runcontrol.edge.auth import Caller
from runcontrol.ports.policy import DEFAULT_POLICY_ID, document_from_dict, publish_policy
from runcontrol.ports.releases import move_alias, publish_release
from runcontrol.store import Database, rates
from runcontrol.store import schedules as schedule_rows
from runcontrol.store.commit import Store
from runcontrol.store.move_rows import TABLES, fence, unfence
from runcontrol.store.writers import WRITTEN

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DEFINITION = WorkflowDefinition("wf", (StepSpec(name="only", agent_id="agent-a"),))
# The tenant tables whose writes go through a document (fenced once by the document's check)
# or are the system's own (the relay's feed pages and deliveries, retention's deletes: their loss
# between a move's verification and its flip is work done again, never a caller's write).
DOCUMENTS = {
    *WRITTEN,
    "runs",
    "budget_reservations",
    "flow_slots",
    "flow_waiters",
    "output_chunks",
    "output_heads",
}
SYSTEM = {"webhook_deliveries", "feed_pages", "recovery_journal_legacy"}


@pytest.fixture
def owner(db: Database) -> Iterator[Engine]:
    engine = create_engine(db.owner_url, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def fenced(db: Database, owner: Engine, tenant: str) -> Iterator[str]:
    """``tenant`` fenced in ``db`` (its rows moving to database 1) for the test."""
    with owner.begin() as conn:
        fence(conn, [tenant], vshard=3, to=1, epoch=1)
    yield tenant
    with owner.begin() as conn:
        unfence(conn, [tenant])


def _schedule(db: Database, tenant: str) -> uuid.UUID:
    caller = Caller(
        Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
        frozenset({"factory.runs.write"}),
    )
    doc = {"run": {"workflowId": "wf", "modelProfileId": "m"}, "intervalSeconds": 2}
    row = rules.new_row(caller, doc, False, None, NOW)
    with db.tenant(tenant) as conn:
        schedule_rows.insert_schedule(conn, row)
    sid: uuid.UUID = row["schedule_id"]
    return sid


def _rate(db: Database, tenant: str) -> None:
    store = Store(db.app_url, size=1)
    try:
        drive(rates.consume(store, tenant, Draw("tokens", 5.0, 10.0, 1.0), NOW))
    finally:
        drive(store.close())


WRITES: dict[str, tuple[str, Callable[[Database, str], Any]]] = {
    "a release published": (
        "releases",
        lambda db, t: publish_release(db, t, DEFINITION, "oscar", NOW),
    ),
    "a policy revision": (
        "policies",
        lambda db, t: publish_policy(db, t, document_from_dict(DEFAULT_POLICY_ID, "", {}), NOW),
    ),
    "a schedule created": ("schedules", _schedule),
    "a webhook subscription created": (
        "webhook_subscriptions",
        lambda db, t: subscribe(db, t, NOW),
    ),
    "a rate bucket drawn": ("rate_buckets", _rate),
}


def _count(db: Database, table: str, tenant: str) -> int:
    with db.system.connect() as conn:
        query = text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t")
        return int(conn.execute(query, {"t": tenant}).scalar_one())


@pytest.mark.parametrize("kind", list(WRITES))
def test_a_fenced_tenants_write_is_refused_and_stores_nothing(
    db: Database, fenced: str, kind: str
) -> None:
    table, write = WRITES[kind]
    with pytest.raises(errors.ShardMoved, match="moved with virtual shard 3 to database 1") as e:
        write(db, fenced)
    assert e.value.retryable
    assert _count(db, table, fenced) == 0
    other = f"{fenced}-b"  # another tenant of the same database writes on
    write(db, other)
    assert _count(db, table, other) >= 1


def test_a_fenced_tenants_changes_and_deletes_are_refused(
    db: Database, owner: Engine, tenant: str
) -> None:
    """Rows written before the fence: an alias moved, a schedule paused or deleted, a webhook
    subscription disabled are refused once it commits, and the rows stay as they were."""
    release = publish_release(db, tenant, DEFINITION, "oscar", NOW)
    sid = _schedule(db, tenant)
    hook = subscribe(db, tenant, NOW)
    with owner.begin() as conn:
        fence(conn, [tenant], vshard=3, to=1, epoch=1)
    try:
        changes: list[Callable[[], Any]] = [
            lambda: move_alias(db, tenant, "wf", "stable", release.release_id, NOW),
            lambda: _in(db, tenant, schedule_rows.update_schedule, sid, paused=True),
            lambda: _in(db, tenant, schedule_rows.delete_schedule, sid),
            lambda: _in(db, tenant, _disable, uuid.UUID(hook["subscriptionId"])),
        ]
        for change in changes:
            with pytest.raises(errors.ShardMoved):
                change()
    finally:
        with owner.begin() as conn:
            unfence(conn, [tenant])
    with db.tenant(tenant) as conn:
        row = schedule_rows.get_row(conn, sid)
        aliases = conn.execute(text("SELECT alias FROM release_aliases")).scalars().all()
        disabled = conn.execute(text("SELECT disabled_at FROM webhook_subscriptions")).scalar()
    assert row is not None and not row.paused
    assert aliases == ["latest"] and disabled is None
    assert _in(db, tenant, schedule_rows.delete_schedule, sid)  # unfenced: as before
    assert _count(db, "schedules", tenant) == 0


def _in(db: Database, tenant: str, change: Callable[..., Any], *args: Any, **values: Any) -> Any:
    with db.tenant(tenant) as conn:
        return change(conn, *args, **values)


def _disable(conn: Any, subscription_id: uuid.UUID) -> bool:
    from runcontrol.store.webhooks import disable_subscription

    return disable_subscription(conn, subscription_id, NOW)


def test_the_fence_waits_for_a_configuration_write_in_flight(
    db: Database, owner: Engine, tenant: str
) -> None:
    fenced = threading.Event()

    def write_fence() -> None:
        with owner.begin() as conn:
            fence(conn, [tenant], vshard=3, to=1, epoch=1)
        fenced.set()

    try:
        with db.tenant(tenant) as in_flight:  # a schedule's insert, its trigger passed
            caller = Caller(
                Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
                frozenset({"factory.runs.write"}),
            )
            doc = {"run": {"workflowId": "wf", "modelProfileId": "m"}, "intervalSeconds": 2}
            schedule_rows.insert_schedule(in_flight, rules.new_row(caller, doc, False, None, NOW))
            writer = threading.Thread(target=write_fence)
            writer.start()
            assert not fenced.wait(0.5)  # the fence waits for it
        writer.join(10)
        assert fenced.is_set()
        assert _count(db, "schedules", tenant) == 1  # committed before the fence: it moves
        with pytest.raises(errors.ShardMoved):
            _schedule(db, tenant)
        assert _count(db, "schedules", tenant) == 1
    finally:
        with owner.begin() as conn:
            unfence(conn, [tenant])


def test_the_schedules_sweep_skips_a_fenced_tenant_and_advances_the_others(
    scratch: Database, tenant: str
) -> None:
    moving, staying = tenant, f"{tenant}-b"
    moving_sid, staying_sid = _schedule(scratch, moving), _schedule(scratch, staying)
    owner = create_engine(scratch.owner_url, poolclass=NullPool)
    with owner.begin() as conn:
        fence(conn, [moving], vshard=3, to=1, epoch=1)
    try:
        started = rules.decide_due(scratch, NOW + timedelta(seconds=3))
        with scratch.system.connect() as conn:
            advanced = dict(
                conn.execute(text("SELECT schedule_id, last_nominal_at FROM schedules")).all()
            )
            fires = conn.execute(text("SELECT DISTINCT schedule_id FROM schedule_fires")).all()
    finally:
        with owner.begin() as conn:
            unfence(conn, [moving])
        owner.dispose()
    assert started == 1
    assert advanced[moving_sid] == NOW < advanced[staying_sid]  # as created; advanced
    assert [f for (f,) in fires] == [staying_sid]


def test_every_tenant_table_written_outside_a_document_is_fenced(owner_engine: Engine) -> None:
    """Each tenant table a move copies is written by documents, by the system's own sweeps,
    or carries the fence's trigger: a new table needs that decision."""
    with owner_engine.connect() as conn:
        triggered = set(
            conn.execute(
                text(
                    "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                    " WHERE t.tgname = 'fenced_write'"
                )
            ).scalars()
        )
    tables = {t.name for t in TABLES}
    assert triggered == tables - DOCUMENTS - SYSTEM
    assert not triggered & DOCUMENTS  # no trigger on the hot path's tables


def test_the_cli_says_a_fenced_write_is_retryable_in_one_line(
    db: Database,
    fenced: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``runcontrol release`` straight to the database while its tenant moves: the code, why and
    that it may be sent again, in one line with exit 75 (EX_TEMPFAIL), no traceback."""
    file = tmp_path / "wf.json"
    file.write_text(json.dumps({"workflowId": "wf", "steps": [{"agentId": "agent-a"}]}))
    monkeypatch.setenv("RUNCONTROL_DATABASE_URL", db.owner_url)
    assert cli.main(["release", str(file), "--tenant", fenced]) == cli.EX_TEMPFAIL
    err = capsys.readouterr().err
    assert err.startswith("runcontrol release: shard-moved: ") and "send it again" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert _count(db, "releases", fenced) == 0
