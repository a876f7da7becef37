"""The fence of a shard's move (``runcontrol_check_fence``, migration 0034): written under each
tenant's lock taken exclusive, it waits for the tenant's document in flight; once it commits,
a document of the tenant is refused in its own transaction (RC421), another tenant's is not."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.pool import NullPool
from support import race_async, renew_command

from runcontrol.domain import errors
from runcontrol.store import Database
from runcontrol.store.move_rows import fence, unfence

CHECK = text("SELECT runcontrol_check_fence(:tenant)")


def test_the_fence_waits_for_a_document_in_flight_and_refuses_the_next(db: Database, tenant: str):
    owner = create_engine(db.owner_url, poolclass=NullPool)
    fenced = threading.Event()

    def write_fence() -> None:
        with owner.begin() as conn:
            fence(conn, [tenant], vshard=3, to=1, epoch=1)
        fenced.set()

    with db.tenant(tenant) as in_flight:  # a document's transaction, its check passed
        in_flight.execute(CHECK, {"tenant": tenant})
        writer = threading.Thread(target=write_fence)
        writer.start()
        assert not fenced.wait(0.5)  # the fence waits for it
    writer.join(10)
    assert fenced.is_set()

    with pytest.raises(errors.ShardMoved, match="moved with virtual shard 3 to database 1") as err:
        with db.tenant(tenant) as conn:
            conn.execute(CHECK, {"tenant": tenant})
    cause = err.value.__cause__
    assert isinstance(cause, exc.DBAPIError) and cause.orig is not None
    assert cause.orig.sqlstate == "RC421" and err.value.retryable
    with db.tenant(f"{tenant}-b") as conn:  # another tenant's documents go on
        conn.execute(CHECK, {"tenant": f"{tenant}-b"})

    with owner.begin() as conn:
        unfence(conn, [tenant])
    with db.tenant(tenant) as conn:
        conn.execute(CHECK, {"tenant": tenant})
    owner.dispose()


def test_in_a_group_commit_the_fenced_tenants_document_alone_is_refused(
    db: Database, tenant: str, make_leased_run: Any
):
    fenced, other = make_leased_run(tenant), make_leased_run(f"{tenant}-b")
    owner = create_engine(db.owner_url, poolclass=NullPool)
    with owner.begin() as conn:
        fence(conn, [tenant], vshard=3, to=1, epoch=1)
    try:
        (k1, refused), (k2, _) = race_async(
            *(
                run.grain.grain.execute(renew_command(run.grain, run.grant))
                for run in (fenced, other)
            )
        )
    finally:
        with owner.begin() as conn:
            unfence(conn, [tenant])
        owner.dispose()
    assert k1 == "err" and isinstance(refused, errors.ShardMoved), refused
    assert refused.retryable and k2 == "ok"


def test_nothing_of_the_tenant_commits_after_its_fence_under_concurrent_writes(
    db: Database, tenant: str
):
    """Writers that each check the fence and then write (as a document does), racing the
    fence: every row committed is there when the fence has committed, none after it."""
    count = text("SELECT count(*) FROM audit_log WHERE tenant_id = :tenant")
    write = text(
        "INSERT INTO audit_log (tenant_id, kind, actor, detail, occurred_at)"
        " VALUES (:tenant, 'probe', 'writer', '{}'::jsonb, now())"
    )
    refused: list[int] = []

    def writer() -> None:
        while True:
            try:
                with db.tenant(tenant) as conn:
                    conn.execute(CHECK, {"tenant": tenant})
                    conn.execute(text("SELECT pg_sleep(0.05)"))  # the document's other writes
                    conn.execute(write, {"tenant": tenant})
            except errors.ShardMoved:  # RC421, raised typed by Database.tenant
                refused.append(1)
                return

    writers = [threading.Thread(target=writer) for _ in range(4)]
    for w in writers:
        w.start()
    owner = create_engine(db.owner_url, poolclass=NullPool)
    try:
        with db.system.connect() as conn:  # let them commit some first
            while conn.execute(count, {"tenant": tenant}).scalar_one() < 20:
                conn.commit()
        with owner.begin() as conn:
            fence(conn, [tenant], vshard=3, to=1, epoch=1)
        with db.system.connect() as conn:
            at_fence = conn.execute(count, {"tenant": tenant}).scalar_one()
        for w in writers:
            w.join(10)
        with db.system.connect() as conn:
            assert conn.execute(count, {"tenant": tenant}).scalar_one() == at_fence
        assert len(refused) == len(writers)
    finally:
        with owner.begin() as conn:
            unfence(conn, [tenant])
        owner.dispose()
