"""Helpers shared by the test layers (importable because tests/ holds the root conftest)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar
from uuid import UUID

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import make_url

from runcontrol.commands import (
    AcquireLease,
    CancelRun,
    Command,
    DecideApproval,
    RenewLease,
    ReportOutcome,
    RequestApproval,
)
from runcontrol.config import WebhookOptions
from runcontrol.domain import (
    ApprovalRequest,
    AttemptOutcome,
    Decision,
    LeaseGrant,
    Principal,
    canonical_hash,
)
from runcontrol.domain.shards import hashed_vshard
from runcontrol.grain import RunGrain
from runcontrol.store import Database
from runcontrol.webhooks import create_subscription

T = TypeVar("T")

# ---------------------------------------------------------------------- driving grains

# The event loop synchronous tests drive grains on (a grain's store is bound to the loop that
# first used it). Production code awaits grains on a host's loop; only tests block on them.
LOOP = asyncio.new_event_loop()


def drive(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its result on the tests' loop."""
    return LOOP.run_until_complete(awaitable)  # type: ignore[arg-type]


async def gathered(*calls: Awaitable[Any]) -> list[tuple[str, Any]]:
    """Await ``calls`` concurrently; return ("ok"|"err", value) per call, in order."""
    found = await asyncio.gather(*calls, return_exceptions=True)
    return [("err", v) if isinstance(v, Exception) else ("ok", v) for v in found]


def race_async(*calls: Awaitable[Any]) -> list[tuple[str, Any]]:
    """``race`` for coroutines: all start in the same turn of the tests' loop, each on its own
    connection, so their commits really contend in the database."""
    return drive(gathered(*calls))


class SyncGrain:
    """A ``RunGrain`` a synchronous test drives: ``execute`` blocks on the tests' loop."""

    def __init__(self, grain: RunGrain) -> None:
        self.grain = grain

    def execute(self, command: Command[T]) -> T:
        return drive(self.grain.execute(command))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grain, name)


def race(*calls: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run ``calls`` in threads released together by a barrier; return ("ok"|"err", value)."""
    barrier = threading.Barrier(len(calls))
    results: list[tuple[str, Any]] = [("missing", None)] * len(calls)

    def body(i: int, call: Callable[[], Any]) -> None:
        barrier.wait(timeout=10)
        try:
            results[i] = ("ok", call())
        except Exception as exc:  # handed to the test to assert on
            results[i] = ("err", exc)

    threads = [threading.Thread(target=body, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a racing command hung"
    return results


# ---------------------------------------------------------------------- a run's commands

# What a test's grain is sent, with the fields every such command carries filled in (the tenant
# and run from the grain, the lease fields from the grant); ``overrides`` replace any of them.
# ``*_command`` builds the command (to await it on a RunGrain, or to send it twice); the
# function without the suffix sends it to a SyncGrain.

WORKER = "worker-1"
# The tests' token key: the API's (tests/api), and the run hosts', which check the workers'
# tokens of the gRPC exchanges they serve themselves.
SECRET = "api-test-secret-" + "0123456789abcdef" * 4  # long enough for HS512 too
ISSUER = "https://idp.runcontrol.test/"
AUDIENCE = "runcontrol-api"


def proposal(n: int = 1) -> str:
    return canonical_hash({"proposal": n})


def fenced(grant: LeaseGrant, tenant: str, **overrides: Any) -> dict[str, Any]:
    """The fields every lease holder's command carries, from its grant."""
    values: dict[str, Any] = {
        "tenant_id": tenant,
        "run_id": grant.run_id,
        "attempt_id": grant.attempt_id,
        "holder": grant.holder,
        "fencing_token": grant.fencing_token,
        "lease_id": grant.lease_id,
    }
    values.update(overrides)
    return values


class AddressesRun(Protocol):
    """A grain a test sends commands to (``SyncGrain`` or ``RunGrain``)."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def run_id(self) -> UUID: ...


def held(grain: AddressesRun, grant: LeaseGrant, overrides: dict[str, Any]) -> dict[str, Any]:
    """The fields of a lease holder's command to ``grain``, from its grant, with ``overrides``."""
    fields: dict[str, Any] = {
        "tenant_id": grain.tenant_id,
        "run_id": grain.run_id,
        "attempt_id": grant.attempt_id,
        "holder": grant.holder,
        "fencing_token": grant.fencing_token,
    }
    fields.update(overrides)
    return fields


def report_command(
    grain: AddressesRun, grant: LeaseGrant, outcome: AttemptOutcome, **overrides: Any
) -> ReportOutcome:
    """The lease holder reports ``outcome`` (``overrides``: a hash, a failure class, ...)."""
    return ReportOutcome(outcome=outcome, **held(grain, grant, overrides))


def report(grain: SyncGrain, grant: LeaseGrant, outcome: AttemptOutcome, **overrides: Any) -> Any:
    return grain.execute(report_command(grain, grant, outcome, **overrides))


def acquire(grain: SyncGrain, attempt_id: UUID, holder: str = WORKER) -> LeaseGrant:
    """``holder`` claims the attempt ``attempt_id``."""
    return grain.execute(
        AcquireLease(
            tenant_id=grain.tenant_id, run_id=grain.run_id, attempt_id=attempt_id, holder=holder
        )
    )


def renew_command(grain: AddressesRun, grant: LeaseGrant, **overrides: Any) -> RenewLease:
    """The lease holder renews its lease (``overrides``: another holder, token, ...)."""
    return RenewLease(**held(grain, grant, overrides))


def renew(grain: SyncGrain, grant: LeaseGrant, **overrides: Any) -> LeaseGrant:
    return grain.execute(renew_command(grain, grant, **overrides))


def request_approval(
    grain: SyncGrain, grant: LeaseGrant, n: int = 1, **overrides: Any
) -> ApprovalRequest | None:
    """The lease holder asks approval for ``proposal(n)``."""
    return grain.execute(
        RequestApproval(proposal_hash=proposal(n), **held(grain, grant, overrides))
    )


def decide_command(
    grain: AddressesRun,
    approval: ApprovalRequest,
    principal: Principal,
    decision: Decision = Decision.APPROVE,
    *,
    version: int | None = None,
    proposal_hash: str | None = None,
    reason: str | None = None,
) -> DecideApproval:
    """``principal`` decides ``approval`` (by default at the version and hash it was seen at)."""
    return DecideApproval(
        tenant_id=grain.tenant_id,
        run_id=grain.run_id,
        approval_id=approval.approval_id,
        principal=principal,
        decision=decision,
        version=approval.version if version is None else version,
        proposal_hash=proposal_hash or approval.proposal_hash,
        reason=reason,
    )


def decide(
    grain: SyncGrain, approval: ApprovalRequest, principal: Principal, *args: Any, **kw: Any
) -> ApprovalRequest:
    return grain.execute(decide_command(grain, approval, principal, *args, **kw))


def cancel_command(
    grain: AddressesRun, reason: str = "stop", requested_by: str = "ops"
) -> CancelRun:
    """A cancellation of the run; its answer is the run's state name."""
    return CancelRun(
        tenant_id=grain.tenant_id, run_id=grain.run_id, requested_by=requested_by, reason=reason
    )


def cancel(grain: SyncGrain, reason: str = "stop", requested_by: str = "ops") -> str:
    return grain.execute(cancel_command(grain, reason, requested_by))


def run_rows(db: Database, tenant: str, table: Any, run_id: UUID, order: Any = None) -> list[Any]:
    """A run's rows of ``table`` as its tenant sees them (row-level security applies)."""
    stmt = select(table).where(table.c.run_id == run_id)
    if order is not None:
        stmt = stmt.order_by(order)
    with db.tenant(tenant) as conn:
        return list(conn.execute(stmt))


# ---------------------------------------------------------------------- workers


def endless_agent(worker: Any, agent_id: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Register on the SDK ``worker`` an async function for ``agent_id`` that runs until it is
    cancelled; answers the events (started, interrupted) it sets."""
    started, interrupted = asyncio.Event(), asyncio.Event()

    @worker.agent(agent_id)
    async def endless(step: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    return started, interrupted


def stop_processes(*processes: subprocess.Popen[Any] | None) -> None:
    """Terminate the child processes still running (a test's ``finally``); one that has not
    exited 15 s later (a worker draining a long attempt) is killed, so none outlives its test
    (its ``Popen`` would fail a later test with a ResourceWarning)."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)


# ---------------------------------------------------------------------- injected faults

# Where a test can make a write fail inside the statement that makes it: the table whose row
# write trips the fault, and when. "after-run": the run row is written, nothing else yet;
# "before-outbox": the child rows are written too; "after-events": and the event rows, with
# the journal entries they carry (0033).
FAULT_POINTS = {
    "after-run": ("runs", "AFTER INSERT OR UPDATE"),
    "before-outbox": ("outbox", "BEFORE INSERT"),
    "after-events": ("outbox", "AFTER INSERT"),
}
CHECKPOINTS = tuple(FAULT_POINTS)
FAULT_SQLSTATE = "TF999"  # a code nothing else raises; psycopg maps it to DatabaseError


class Faults:
    """Test-only triggers that fail a run's writes at a checkpoint (``faults`` fixture).

    ``install`` creates, as the schema owner, the table ``test_faults`` and one trigger per
    checkpoint; a trigger raises ``FAULT_SQLSTATE`` with ``message(checkpoint)`` when the row it
    sees belongs to a run armed at its checkpoint. The trigger function is SECURITY DEFINER, so
    the app role that makes the writes needs (and has) no grant on the table, and row-level
    security does not apply to it. ``uninstall`` drops it all. Arming is a row: it holds for
    every write of that run until disarmed.
    """

    def __init__(self, owner: Engine) -> None:
        self._owner = owner

    @staticmethod
    def message(checkpoint: str) -> str:
        return f"test fault at {checkpoint}"

    def install(self) -> None:
        statements = [
            "CREATE TABLE test_faults (run_id uuid NOT NULL, checkpoint text NOT NULL,"
            " message text NOT NULL, PRIMARY KEY (run_id, checkpoint))",
            "REVOKE ALL ON test_faults FROM PUBLIC",
            f"""CREATE FUNCTION test_fault() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
            DECLARE
                fault_message text;
            BEGIN
                SELECT message INTO fault_message FROM test_faults
                    WHERE run_id = NEW.run_id AND checkpoint = TG_ARGV[0];
                IF FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = '{FAULT_SQLSTATE}', MESSAGE = fault_message;
                END IF;
                RETURN NEW;
            END $fn$""",
            "REVOKE ALL ON FUNCTION test_fault() FROM PUBLIC",
        ]
        for checkpoint, (table, timing) in FAULT_POINTS.items():
            statements.append(
                f"CREATE TRIGGER {_trigger(checkpoint)} {timing} ON {table}"
                f" FOR EACH ROW EXECUTE FUNCTION test_fault('{checkpoint}')"
            )
        self._run(statements)

    def uninstall(self) -> None:
        self._run(
            [f"DROP TRIGGER IF EXISTS {_trigger(c)} ON {t}" for c, (t, _) in FAULT_POINTS.items()]
            + ["DROP FUNCTION IF EXISTS test_fault()", "DROP TABLE IF EXISTS test_faults"]
        )

    def arm(self, run_id: UUID, checkpoint: str) -> None:
        """Fail every write of ``run_id`` reaching ``checkpoint``, until ``disarm``."""
        assert checkpoint in FAULT_POINTS, checkpoint
        with self._owner.begin() as conn:
            conn.execute(
                text("INSERT INTO test_faults VALUES (:run_id, :checkpoint, :message)"),
                {"run_id": run_id, "checkpoint": checkpoint, "message": self.message(checkpoint)},
            )

    def disarm(self, run_id: UUID) -> None:
        with self._owner.begin() as conn:
            conn.execute(text("DELETE FROM test_faults WHERE run_id = :r"), {"r": run_id})

    def _run(self, statements: list[str]) -> None:
        with self._owner.begin() as conn:
            # DDL on runs waits for every transaction touching it: fail instead of hanging.
            conn.execute(text("SET LOCAL lock_timeout = '10s'"))
            for statement in statements:
                conn.exec_driver_sql(statement)


def _trigger(checkpoint: str) -> str:
    return "test_fault_" + checkpoint.replace("-", "_")


# ---------------------------------------------------------------------- suites and databases


def skip_slow_unless_selected(
    config: pytest.Config, items: list[pytest.Item], folder: Path
) -> None:
    """Skip the tests marked ``slow`` below ``folder`` unless slow tests are selected
    (``-m slow``, or RUNCONTROL_RUN_SLOW=1 as ``make test`` sets): a conftest's
    ``pytest_collection_modifyitems``."""
    if "slow" in (config.getoption("-m") or "") or os.environ.get("RUNCONTROL_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow: select with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and folder in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


# Where the two-shard fixture (conftest.two_shards) puts its second database: the virtual shards
# from this one on.
SECOND_HALF = 512


def tenant_in(half: int) -> str:
    """A fresh tenant whose virtual shard (its hash) is in the first (0) or second (1) half."""
    while True:
        tenant = f"t-{uuid.uuid4().hex[:10]}"
        if (hashed_vshard(tenant) >= SECOND_HALF) == bool(half):
            return tenant


def place_second_half(first: Database, database: int) -> None:
    """The virtual shards from ``SECOND_HALF`` on, onto ``database`` (a position in the list)
    in the directory ``first`` holds; its version bumped, so every process reloads it."""
    with first.system_tx() as conn:
        conn.execute(
            text("UPDATE vshards SET database = :d WHERE vshard >= :v"),
            {"d": database, "v": SECOND_HALF},
        )
        conn.execute(text("UPDATE directory_version SET version = version + 1"))


def counted(db: Database, table: str, tenant: str) -> int:
    """The rows of ``tenant`` in ``db``'s ``table`` (read on the system path)."""
    with db.system_tx() as conn:
        found = conn.execute(
            text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"), {"t": tenant}
        )
        return int(found.scalar_one())


def new_database(owner_url: str, prefix: str) -> Database:
    """A fresh, migrated database on the session's server, for a runtime of its own."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    database = Database(
        make_url(owner_url).set(database=name).render_as_string(hide_password=False), pool_size=8
    )
    database.migrate()
    return database


def drop_database(owner_url: str, database: Database) -> None:
    """Dispose of ``database`` (made by ``new_database``) and drop it from the server."""
    database.dispose()
    name = database.owner_url.rsplit("/", 1)[1].split("?")[0]
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@contextmanager
def ray_on_two_databases(ray_runtime: Any, owner_url: str, prefix: str) -> Iterator[Any]:
    """The session's Ray runtime (tests/conftest.py) on its database and a second one made on
    its server (``prefix``), the virtual shards from ``SECOND_HALF`` on there: its run hosts
    restarted with both listed. Yields the runtime's view on both (``client``, ``container``,
    ``settings``, ``shards``, ``first``, ``second``); after, the hosts, the directory and the
    databases as they were."""
    from types import SimpleNamespace

    from runcontrol.bootstrap import build
    from runcontrol.config import Settings
    from runcontrol.store.shards import Shards

    first: Database = ray_runtime.container.db
    second = new_database(owner_url, prefix)
    raw = ray_runtime.settings.model_dump(mode="json")
    raw["shards"] = {"databases": [first.owner_url, second.owner_url]}
    settings = Settings.model_validate(raw)
    place_second_half(first, 1)
    shards = Shards([Database(first.owner_url), second], pool_size=2)
    try:
        ray_runtime.use_hosts(settings)
        yield SimpleNamespace(
            client=ray_runtime.client,
            container=build(settings, db=shards.db, migrate=False),
            settings=settings,
            shards=shards,
            first=first,
            second=second,
        )
    finally:
        ray_runtime.use_hosts(ray_runtime.settings)  # the session's hosts: one database again
        place_second_half(first, 0)
        shards.all()[0].db.dispose()
        drop_database(owner_url, second)


@contextmanager
def scratch_database(owner_url: str, prefix: str = "runcontrol_scratch") -> Iterator[Database]:
    """A migrated database of its own on the session's server, dropped afterwards."""
    database = new_database(owner_url, prefix)
    try:
        yield database
    finally:
        drop_database(owner_url, database)


def subscribe(db: Database, tenant: str, now: datetime) -> dict[str, Any]:
    """A webhook subscription of ``tenant`` created at ``now`` (to a port nobody listens on)."""
    return create_subscription(
        db,
        tenant,
        url="http://127.0.0.1:9/hook",
        description=None,
        max_attempts=3,
        created_by="oscar",
        options=WebhookOptions(allow_private_addresses=True),
        now=now,
    )


# The runs' events by outbox id, each with its feed position (NULL while the relay has not
# published it: 0039, in a page of ``feed_pages``, read through ``event_feed``).
_FED = text(
    "SELECT o.id, o.event_id, o.tenant_id, f.position FROM outbox o LEFT JOIN event_feed f"
    " ON f.event_id = o.event_id WHERE o.run_id = ANY(:ids) ORDER BY o.id"
)


def fed(db: Database, run_ids: list[UUID]) -> list[Any]:
    """The runs' events (id, event_id, tenant_id, position: None while unpublished)."""
    with db.system_tx() as conn:
        return list(conn.execute(_FED, {"ids": run_ids}))


def published(db: Database, run_ids: list[UUID]) -> dict[str, int | None]:
    """Each of the runs' events (its event id) and its feed position (None: unpublished)."""
    return {str(r.event_id): r.position for r in fed(db, run_ids)}
