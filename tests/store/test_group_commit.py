"""Group commit (``GroupCommit`` in ``runcontrol/store/group.py``, migration 0003): every
document committed on one event loop in the same turn goes in one ``runcontrol_apply_many``
statement, each document in its own subtransaction, the group's runs written in run-id order.
At most ``max_in_flight`` statements are unanswered; what arrives meanwhile forms the next group,
of at most ``max_group`` documents.

Three parts, none timed. Grains on the real database: the commands of cached runs started in
the same turn (``race_async``) share one statement, and whatever fails in it (a lost race, a
refusal, an injected fault, a NUL, a lost connection) answers only its own callers, or every
caller of the group when the connection is lost. Documents prepared by hand and committed
through the container's group commit in one turn: a stale version and a used idempotency key
fail alone. The committer alone, with an in-process sender whose statements the test answers
one by one: the scheduling rules.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from uuid import UUID

import orjson
import psycopg
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool
from store_support import (
    accepted,
    assert_completed_once,
    commit,
    complete,
    load,
    principal,
    renewed,
    request,
    runs_for_key,
    send,
    sent,
    sent_since,
    snapshot,
    submit,
    terminate_store_backends,
)
from support import CHECKPOINTS, Faults, SyncGrain, race_async

from runcontrol.bootstrap import Container
from runcontrol.commands import AcquireLease, Command, RenewLease, ReportOutcome
from runcontrol.domain import Attempt, AttemptOutcome, LeaseGrant, canonical_hash, errors
from runcontrol.grain import RunGrain
from runcontrol.store import Database, DuplicateSubmission, GroupCommit
from runcontrol.store.commit import Answer
from runcontrol.store.group import Sender

# ---------------------------------------------------------------------- harness


class Recorded:
    """A sender that records the documents of each statement, then sends it (``send``)."""

    def __init__(self, send: Sender) -> None:
        self._send = send
        self.sent: list[list[str]] = []

    async def __call__(self, docs: list[str]) -> list[Answer]:
        self.sent.append(list(docs))
        return await self._send(docs)

    def runs(self) -> list[list[UUID]]:
        """Each statement's runs, in the order it wrote them."""
        return [[UUID(orjson.loads(doc)["run"]["run_id"]) for doc in docs] for docs in self.sent]


@pytest.fixture
def recorded(container: Container, monkeypatch: pytest.MonkeyPatch) -> Callable[[], Recorded]:
    """``recorded()``: from now on the grains commit through a fresh group commit on the real
    store whose statements are recorded (call it once the test's runs exist)."""

    def install() -> Recorded:
        sender = Recorded(container.store.send)
        monkeypatch.setattr(container.env, "commits", GroupCommit(sender))
        return sender

    return install


def in_run_order(ids: list[UUID]) -> list[UUID]:
    """A group writes its runs in run-id order, so two groups that touch the same runs (two
    activations on two hosts) lock them in the same order and never deadlock."""
    return sorted(ids, key=str)


def outcome(run: Any, token: int | None = None) -> ReportOutcome:
    """The holder's success (``token``: another fencing token than the grant's)."""
    grant = run.grant
    return ReportOutcome(
        tenant_id=run.tenant,
        run_id=run.run_id,
        attempt_id=grant.attempt_id,
        holder=grant.holder,
        fencing_token=grant.fencing_token if token is None else token,
        outcome=AttemptOutcome.SUCCEEDED,
        outcome_hash=canonical_hash({"result": 1}),
    )


def on(grain: SyncGrain, command: Command[Any]) -> Awaitable[Any]:
    """``command`` on ``grain``, to be awaited on the tests' loop (``race_async``)."""
    return grain.grain.execute(command)


def completed_events(container: Container, run: Any) -> int:
    with container.db.tenant(run.tenant) as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM outbox WHERE run_id = %s AND event_type = 'RunCompleted'",
            (run.run_id,),
        ).scalar_one()


# ---------------------------------------------------------------------- grains on the database


def test_cached_runs_reporting_at_once_commit_whole_in_one_statement(
    container, tenant, make_leased_run, recorded
):
    """Twelve cached grains report in the same turn: one statement carries all twelve
    documents, in run-id order, and each run commits whole. Two tenants share the statement:
    each document runs under its own tenant."""
    db = container.db
    runs = [make_leased_run((tenant, f"{tenant}-b")[i % 2]) for i in range(12)]
    before = {run.run_id: snapshot(db, run.tenant, run.run_id) for run in runs}
    statements = recorded()
    start = sent(container)

    results = race_async(*(on(run.grain, outcome(run)) for run in runs))

    assert [kind for kind, _ in results] == ["ok"] * 12, results
    for run, (_, attempt) in zip(runs, results, strict=True):
        assert isinstance(attempt, Attempt), attempt
        assert (attempt.attempt_id, str(attempt.state)) == (run.attempt_id, "Succeeded")
    assert statements.runs() == [in_run_order([run.run_id for run in runs])]
    assert sent_since(container, start) == (1, 12)
    for run in runs:
        assert_completed_once(db, run.tenant, run.run_id, before[run.run_id])


# The append-only tables a group fills after its documents applied (migration 0029).
APPENDED = ("outbox", "command_answers")  # the journal entries on the events (0033)


class Inserts:
    """The INSERT statements into ``APPENDED`` (statement-level triggers, ``inserts``)."""

    def __init__(self, owner: Engine) -> None:
        self._owner = owner
        self._mark = 0

    def mark(self) -> None:
        """Count from now on."""
        with self._owner.connect() as conn:
            found = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM test_inserts")
            self._mark = found.scalar_one()

    def __call__(self, tenant: str) -> list[tuple[str, int]]:
        """Each statement since the mark that wrote rows of ``tenant``: (table, rows), in the
        order they ran."""
        with self._owner.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT tbl, n FROM test_inserts WHERE tenant = %s AND id > %s ORDER BY id",
                (tenant, self._mark),
            )
            return [(t, n) for t, n in found]


@pytest.fixture
def inserts(db: Database) -> Iterator[Inserts]:
    """The INSERT statements into ``APPENDED``, counted by statement-level triggers installed
    for this test only."""
    owner = create_engine(db.owner_url, poolclass=NullPool)
    with owner.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE test_inserts (id bigserial, tbl text, tenant text, n int)"
        )
        conn.exec_driver_sql(
            """CREATE FUNCTION test_count_inserts() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER AS $fn$
            BEGIN
                INSERT INTO test_inserts (tbl, tenant, n)
                    SELECT TG_TABLE_NAME, tenant_id, count(*) FROM added GROUP BY tenant_id;
                RETURN NULL;
            END $fn$"""
        )
        for table in APPENDED:
            conn.exec_driver_sql(
                f"CREATE TRIGGER test_count_inserts AFTER INSERT ON {table}"
                " REFERENCING NEW TABLE AS added FOR EACH STATEMENT"
                " EXECUTE FUNCTION test_count_inserts()"
            )

    try:
        yield Inserts(owner)
    finally:
        with owner.begin() as conn:
            for table in APPENDED:
                conn.exec_driver_sql(f"DROP TRIGGER test_count_inserts ON {table}")
            conn.exec_driver_sql("DROP FUNCTION test_count_inserts()")
            conn.exec_driver_sql("DROP TABLE test_inserts")
        owner.dispose()


def test_a_group_appends_its_rows_in_one_insert_per_table_and_tenant(
    container, tenant, make_leased_run, recorded, inserts
):
    """Six outcomes of two tenants in one statement: each tenant's events, journal entries and
    answers go in one INSERT per table (not one per document), in the statement's document
    order, each run's events in their sequence."""
    db = container.db
    other = f"{tenant}-b"
    runs = [make_leased_run((tenant, other)[i % 2]) for i in range(6)]
    last = {}
    for name in (tenant, other):
        with db.tenant(name) as conn:
            found = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM outbox")
            last[name] = found.scalar_one()
    statements = recorded()
    inserts.mark()

    results = race_async(*(on(run.grain, outcome(run)) for run in runs))

    assert [kind for kind, _ in results] == ["ok"] * 6, results
    assert statements.runs() == [in_run_order([run.run_id for run in runs])]
    for name in (tenant, other):
        # per run: three events (the last carrying three journal entries), one answer
        assert inserts(name) == [("outbox", 9), ("command_answers", 3)]
        with db.tenant(name) as conn:
            written = [
                tuple(row)
                for row in conn.exec_driver_sql(
                    "SELECT run_id, seq FROM outbox WHERE id > %s ORDER BY id", (last[name],)
                )
            ]
        mine = in_run_order([r.run_id for r in runs if r.tenant == name])
        assert written == sorted(written, key=lambda e: (mine.index(e[0]), e[1]))
        assert len(written) == 9


def test_a_grain_that_lost_its_race_decides_again_in_the_next_group(
    container, tenant, make_leased_run
):
    """Another activation renews the lease first: this activation's cached document loses the
    version guard inside the shared statement, alone; it reloads, decides again and commits in
    a second statement of its own."""
    racer, other = make_leased_run(tenant), make_leased_run(tenant)

    def renewal() -> RenewLease:  # a new command (command_id) each time
        return RenewLease(
            tenant_id=tenant,
            run_id=racer.run_id,
            attempt_id=racer.attempt_id,
            holder=racer.grant.holder,
            fencing_token=racer.grant.fencing_token,
        )

    SyncGrain(RunGrain(container.env, tenant, racer.run_id)).execute(renewal())
    version = load(container, tenant, racer.run_id).run.version
    start = sent(container)

    (k1, renewed), (k2, _) = race_async(
        on(racer.grain, renewal()),
        on(other.grain, outcome(other)),
    )

    assert (k1, k2) == ("ok", "ok") and isinstance(renewed, LeaseGrant), renewed
    assert sent_since(container, start) == (2, 3)
    assert load(container, tenant, racer.run_id).run.version == version + 1
    assert str(load(container, tenant, other.run_id).run.state) == "Completed"


def test_a_refusal_and_a_failed_document_answer_only_their_own_callers(
    container, tenant, make_leased_run, faults: Faults
):
    """A stale fencing token is refused before any write (and audited); a document that fails
    inside the database (an injected fault) rolls back alone; the others commit. The runs are
    listed in descending id order, the reverse of the order a group writes them, so an answer
    handed to the wrong caller shows."""
    runs = sorted((make_leased_run(tenant) for _ in range(3)), key=lambda r: r.run_id, reverse=True)
    stale, faulty, fine = runs
    faults.arm(faulty.run_id, "after-events")
    fresh = SyncGrain(RunGrain(container.env, tenant, faulty.run_id))  # loads, then commits

    (k1, refused), (k2, failed), (k3, _) = race_async(
        on(stale.grain, outcome(stale, token=stale.grant.fencing_token + 1)),
        on(fresh, outcome(faulty)),
        on(fine.grain, outcome(fine)),
    )

    assert k1 == "err" and isinstance(refused, errors.StaleFencingToken), refused
    assert k2 == "err" and isinstance(failed, psycopg.DatabaseError), failed
    assert faults.message("after-events") in str(failed)
    assert k3 == "ok"
    with container.db.tenant(tenant) as conn:
        audits = conn.exec_driver_sql(
            "SELECT count(*) FROM audit_log WHERE run_id = %s AND kind = 'stale-fencing-token'",
            (stale.run_id,),
        ).scalar_one()
    assert audits == 1
    for run in (stale, faulty):
        assert str(load(container, tenant, run.run_id).run.state) == "Running"
        assert completed_events(container, run) == 0
    assert str(load(container, tenant, fine.run_id).run.state) == "Completed"


def test_a_nul_in_one_commands_text_fails_that_command_alone(
    container, tenant, make_leased_run, recorded
):
    """PostgreSQL text cannot hold NUL: sent, such a document would fail its whole group (the
    statement's argument cannot be cast). It is refused before it is sent, as a validation
    error for its caller alone."""
    bad, fine = make_leased_run(tenant, lease=False), make_leased_run(tenant)
    statements = recorded()

    (k1, refused), (k2, _) = race_async(
        on(
            bad.grain,
            AcquireLease(
                tenant_id=tenant, run_id=bad.run_id, attempt_id=bad.attempt_id, holder="w\x00"
            ),
        ),
        on(fine.grain, outcome(fine)),
    )

    assert k1 == "err" and isinstance(refused, errors.ValidationFailed), refused
    assert k2 == "ok"
    assert statements.runs() == [[fine.run_id]]
    assert load(container, tenant, bad.run_id).leases == {}
    assert str(load(container, tenant, fine.run_id).run.state) == "Completed"


def test_a_lost_connection_fails_its_group_as_unavailable_and_a_resend_commits_once(
    container, tenant, make_leased_run, recorded, owner_engine
):
    """The connection the group is sent on is dead (its backend terminated behind the store's
    back): nobody knows what committed, so every caller of the group gets the retryable
    ``Unavailable``; nothing was written. The same commands sent again (same ``command_id``:
    each grain reloads and decides again) commit, once."""
    db = container.db
    runs = [make_leased_run(tenant) for _ in range(4)]
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in runs}
    commands = {run.run_id: outcome(run) for run in runs}
    statements = recorded()
    assert terminate_store_backends(owner_engine) >= 1

    results = race_async(*(on(run.grain, commands[run.run_id]) for run in runs))

    assert [kind for kind, _ in results] == ["err"] * 4, results
    assert all(isinstance(exc, errors.Unavailable) and exc.retryable for _, exc in results)
    assert statements.runs() == [in_run_order(list(commands))]
    for run in runs:
        assert snapshot(db, tenant, run.run_id) == before[run.run_id]

    waiting = list(runs)
    for _ in range(container.settings.pool_size + 1):  # each failure discards a dead connection
        answered = race_async(*(on(run.grain, commands[run.run_id]) for run in waiting))
        for run, (kind, value) in zip(list(waiting), answered, strict=True):
            if kind == "ok":
                waiting.remove(run)
            else:
                assert isinstance(value, errors.Unavailable), value
        if not waiting:
            break
    assert waiting == []
    for run in runs:
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])
    again = race_async(*(on(run.grain, commands[run.run_id]) for run in runs))  # answered only
    assert [kind for kind, _ in again] == ["ok"] * 4, again
    for run in runs:
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])


# ---------------------------------------------------------------------- documents by hand


def test_a_lost_race_fails_alone_in_its_group(container, tenant, make_leased_run, recorded):
    """A document whose expected version is stale (another activation committed to its run
    after it was loaded) is ``ConcurrencyConflict`` to its caller alone: the other documents of
    the statement commit, and nothing of the loser is visible."""
    db = container.db
    first, loser, last = (make_leased_run(tenant) for _ in range(3))
    stale = complete(container, load(container, tenant, loser.run_id), loser.grant)
    send(container, tenant, renewed(container, load(container, tenant, loser.run_id), loser.grant))
    runs = (first, last)
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in (*runs, loser)}
    aggs = [complete(container, load(container, tenant, run.run_id), run.grant) for run in runs]
    statements = recorded()

    (k1, _), (kind, exc), (k3, _) = race_async(
        commit(container, tenant, aggs[0]),
        commit(container, tenant, stale),
        commit(container, tenant, aggs[1]),
    )

    assert (k1, k3) == ("ok", "ok")
    assert kind == "err" and isinstance(exc, errors.ConcurrencyConflict), exc
    assert statements.runs() == [in_run_order([first.run_id, loser.run_id, last.run_id])]
    assert snapshot(db, tenant, loser.run_id) == before[loser.run_id]
    for run in runs:
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])


def test_a_used_idempotency_key_fails_alone_in_its_group(
    container, tenant, make_leased_run, recorded
):
    """A submission whose key already names a run is ``DuplicateSubmission`` to its caller
    alone; a new submission and an outcome in the same statement commit."""
    db = container.db
    other = make_leased_run(tenant)
    existing = submit(
        SyncGrain(RunGrain(container.env, tenant, uuid.uuid4())),
        principal(tenant),
        request("used-key"),
    )
    duplicate = accepted(container, tenant, "used-key")
    fresh = accepted(container, tenant, "fresh-key")
    before = snapshot(db, tenant, other.run_id)
    done = complete(container, load(container, tenant, other.run_id), other.grant)
    statements = recorded()

    (k1, _), (kind, exc), (k3, _) = race_async(
        commit(container, tenant, done),
        commit(container, tenant, duplicate),
        commit(container, tenant, fresh),
    )

    assert (k1, k3) == ("ok", "ok")
    assert kind == "err" and isinstance(exc, DuplicateSubmission), exc
    assert [len(docs) for docs in statements.sent] == [3]
    assert runs_for_key(db, tenant, "used-key") == [existing.run_id]
    assert not any(snapshot(db, tenant, duplicate.run.run_id).values())
    assert runs_for_key(db, tenant, "fresh-key") == [fresh.run.run_id]
    assert snapshot(db, tenant, fresh.run.run_id)["outbox"][0] == (1, "RunAccepted")
    assert_completed_once(db, tenant, other.run_id, before)


@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_a_fault_in_one_document_rolls_back_only_that_document(
    container, tenant, make_leased_run, recorded, faults, checkpoint
):
    """A fault fails one document at a checkpoint inside the statement, after some of its
    writes: they roll back with it, its caller gets the database's error, and the other
    documents of the statement commit."""
    db = container.db
    runs = [make_leased_run(tenant) for _ in range(3)]
    faulty = runs[1]
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in runs}
    aggs = [complete(container, load(container, tenant, run.run_id), run.grant) for run in runs]
    faults.arm(faulty.run_id, checkpoint)
    statements = recorded()

    results = race_async(*(commit(container, tenant, agg) for agg in aggs))

    kind, exc = results[1]
    assert kind == "err" and isinstance(exc, psycopg.DatabaseError), results[1]
    assert faults.message(checkpoint) in str(exc)
    assert [results[0][0], results[2][0]] == ["ok", "ok"], results
    assert statements.runs() == [in_run_order([run.run_id for run in runs])]
    assert snapshot(db, tenant, faulty.run_id) == before[faulty.run_id]
    for run in (runs[0], runs[2]):
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])


# ---------------------------------------------------------------------- the committer alone

# A committer's step (queue, flush, send, answer) each takes a turn of the loop or two, and none
# waits on a timer: this many turns let it do everything it can.
TURNS = 20


async def turns_until(predicate: Callable[[], bool]) -> int:
    """Let the loop turn until ``predicate`` holds; how many turns that took."""
    for turn in range(TURNS):
        if predicate():
            return turn
        await asyncio.sleep(0)
    raise AssertionError(f"still false after {TURNS} turns of the loop")


async def settle() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


class Statements:
    """An in-process sender: records each statement's documents and holds it until the test
    answers it (each document with ``("OK", doc)``) or fails it."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self._held: list[asyncio.Future[None]] = []

    async def __call__(self, docs: list[str]) -> list[Answer]:
        held = asyncio.get_running_loop().create_future()
        self.sent.append(list(docs))
        self._held.append(held)
        await held
        return [("OK", doc) for doc in docs]

    def answer(self, index: int) -> None:
        self._held[index].set_result(None)

    def fail(self, index: int, error: BaseException) -> None:
        self._held[index].set_exception(error)


def drive_scenario(scenario: Callable[[], Awaitable[None]]) -> None:
    race = race_async(scenario())
    assert race[0][0] == "ok", race


def test_arrivals_while_statements_are_out_form_the_next_group_of_at_most_max_group():
    """Two statements out (``max_in_flight``): five documents queue. When one is answered the
    next group leaves with the first three of them (``max_group``), written in key order; the
    other two wait for the next answer. Every caller gets the answer for its own document."""

    async def scenario() -> None:
        statements = Statements()
        group = GroupCommit(statements, max_group=3, max_in_flight=2)
        calls: list[asyncio.Future[Answer]] = []

        def commit_doc(i: int, key: str) -> None:
            calls.append(asyncio.ensure_future(group.commit(f"d{i}", key)))

        commit_doc(0, "k0")
        await turns_until(lambda: len(statements.sent) == 1)
        commit_doc(1, "k1")
        await turns_until(lambda: len(statements.sent) == 2)
        for i in range(2, 7):  # arrive in descending key order
            commit_doc(i, f"k{9 - i}")
        await settle()
        assert statements.sent == [["d0"], ["d1"]]  # two out: the five wait

        statements.answer(0)
        await turns_until(lambda: len(statements.sent) == 3)
        await settle()
        assert statements.sent[2:] == [["d4", "d3", "d2"]]  # two out again: two still wait

        statements.answer(1)
        await turns_until(lambda: len(statements.sent) == 4)
        assert statements.sent[3] == ["d6", "d5"]
        statements.answer(2)
        statements.answer(3)
        assert await asyncio.gather(*calls) == [("OK", f"d{i}") for i in range(7)]

    drive_scenario(scenario)


def test_a_send_that_fails_fails_its_whole_group_and_the_committer_goes_on():
    """A statement whose send raises (its connection was lost) fails each caller of its group
    with that very error; the committer goes on: later documents are sent and answered, also
    after a lone caller's failure, and two statements can be out at once again."""

    async def scenario() -> None:
        statements = Statements()
        group = GroupCommit(statements)
        lost = errors.Unavailable("the database connection was lost")

        pair = [asyncio.ensure_future(group.commit(d, d)) for d in ("d0", "d1")]
        await turns_until(lambda: len(statements.sent) == 1)
        statements.fail(0, lost)
        for call in pair:
            with pytest.raises(errors.Unavailable) as raised:
                await call
            assert raised.value is lost

        lone = asyncio.ensure_future(group.commit("d2", "d2"))
        await turns_until(lambda: len(statements.sent) == 2)
        statements.fail(1, lost)
        with pytest.raises(errors.Unavailable):
            await lone

        later = [asyncio.ensure_future(group.commit("d3", "d3"))]
        await turns_until(lambda: len(statements.sent) == 3)
        later.append(asyncio.ensure_future(group.commit("d4", "d4")))
        await turns_until(lambda: len(statements.sent) == 4)  # both out at once
        statements.answer(3)
        statements.answer(2)
        assert await asyncio.gather(*later) == [("OK", "d3"), ("OK", "d4")]
        assert statements.sent == [["d0", "d1"], ["d2"], ["d3"], ["d4"]]

    drive_scenario(scenario)


def test_a_lone_document_is_sent_at_once_as_a_group_of_one():
    """Nothing waits for company: a document committed with nobody else committing leaves
    within a few turns of the loop (no timer), alone, and the committer is idle again for the
    next one."""

    async def scenario() -> None:
        statements = Statements()
        group = GroupCommit(statements)
        for n, doc in enumerate(("first", "second")):
            call = asyncio.ensure_future(group.commit(doc, doc))
            assert await turns_until(lambda n=n: len(statements.sent) == n + 1) <= 3
            assert statements.sent[n] == [doc]
            statements.answer(n)
            assert await call == ("OK", doc)

    drive_scenario(scenario)
