"""Group commit (``store/group.py``, migration 0003): the documents that threads of one process
commit at the same moment go as one ``runcontrol_apply_many`` statement, sent by the first of
them on its own connection, each document in its own subtransaction.

Grouping is made deterministic here, never timed. ``HeldGroup`` keeps the first group's leader
inside its send until the test has seen every other caller join the queue (``QueueWatch`` wakes
the test whenever the committer's lock is released, so it waits without sleeping); released,
those callers must go as the next group, one statement led by the first of them. The database
tests install a fresh ``HeldGroup`` as the session database's committer (after their runs are
made), so its counters count only the test's own groups.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import orjson
import psycopg
import pytest
from sqlalchemy import Engine, event, text
from store_support import (
    accepted,
    assert_completed_once,
    ctx,
    principal,
    request,
    runs_for_key,
    snapshot,
    submit,
)
from support import CHECKPOINTS

from runcontrol.bootstrap import Container
from runcontrol.commands import ReportOutcome
from runcontrol.domain import (
    AttemptOutcome,
    RunAggregate,
    canonical_hash,
    errors,
)
from runcontrol.grain import RunGrain
from runcontrol.store import Database, DuplicateSubmission, UnitOfWork
from runcontrol.store.group import MAX_GROUP, Answer, GroupCommit, Sender

WAIT = 20  # seconds; only a broken committer ever waits this long
Call = Callable[[], Any]


# ---------------------------------------------------------------------- harness


class QueueWatch:
    """Takes the place of a GroupCommit's lock: the same mutual exclusion, and each release
    wakes ``wait_queued``."""

    def __init__(self, group: GroupCommit) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._group = group
        group._lock = self  # type: ignore[assignment]

    def __enter__(self) -> None:
        self._changed.acquire()

    def __exit__(self, *exc: object) -> None:
        self._changed.notify_all()
        self._changed.release()

    def wait_queued(self, n: int) -> None:
        with self._changed:
            queued = self._changed.wait_for(lambda: len(self._group._queue) == n, WAIT)
            assert queued, f"expected {n} queued, found {len(self._group._queue)}"


class HeldGroup(GroupCommit):
    """A committer whose first group waits inside its leader's send until ``release`` is set.
    ``sent`` records each group sent, in order; ``before_send(index, send)`` runs in the
    leader's thread just before its real send."""

    def __init__(self, max_group: int = MAX_GROUP) -> None:
        super().__init__(max_group)
        self.watch = QueueWatch(self)
        self.sending = threading.Event()
        self.release = threading.Event()
        self.sent: list[list[str]] = []
        self.before_send: Callable[[int, Sender], None] | None = None

    def apply(self, doc: str, send: Sender, key: str = "") -> Answer:
        def held(docs: list[str]) -> list[Answer]:
            index = len(self.sent)  # leaders send one at a time
            self.sent.append(list(docs))
            if index == 0:
                self.sending.set()
                assert self.release.wait(WAIT), "the held group was never released"
            if self.before_send is not None:
                self.before_send(index, send)
            return send(docs)

        return super().apply(doc, held, key)


class Caller:
    """One call on its own daemon thread: a broken committer may leave it waiting forever, and
    it must not keep the test process alive."""

    def __init__(self, call: Call) -> None:
        self._outcome: tuple[str, Any] = ("missing", None)
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Call) -> None:
        try:
            self._outcome = ("ok", call())
        except BaseException as exc:  # handed to the test to assert on
            self._outcome = ("err", exc)

    def outcome(self) -> tuple[str, Any]:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "a caller never got its answer"
        return self._outcome


def one_group(group: HeldGroup, first: Call, rest: Sequence[Call]) -> tuple[Caller, list[Caller]]:
    """``first`` leads a group of its own and is held in its send; each of ``rest`` then joins
    the queue, in this order; then the hold is released."""
    lead = Caller(first)
    assert group.sending.wait(WAIT), "the first caller never sent"
    callers = []
    for n, call in enumerate(rest, 1):
        callers.append(Caller(call))
        group.watch.wait_queued(n)
    group.release.set()
    return lead, callers


@pytest.fixture
def held(container: Container, monkeypatch: pytest.MonkeyPatch) -> Callable[[], HeldGroup]:
    """``held()`` makes a HeldGroup the session database's committer for the rest of the test
    (call it once the runs exist: their setup commits through the committer too)."""

    def install() -> HeldGroup:
        group = HeldGroup()
        monkeypatch.setattr(container.db, "group", group)
        return group

    return install


def run_ids(docs: list[str]) -> list[UUID]:
    return [UUID(orjson.loads(doc)["run"]["run_id"]) for doc in docs]


def in_run_order(ids: list[UUID]) -> list[UUID]:
    """A group writes its runs in run-id order, so two groups that touch the same runs (two
    activations on two hosts) lock them in the same order and never deadlock."""
    return sorted(ids, key=str)


# ---------------------------------------------------------------------- runs and rows


def report(run: Any) -> Call:
    """The holder reports success through its grain (which holds the run cached)."""
    grant = run.grant
    return lambda: run.grain.execute(
        ReportOutcome(
            tenant_id=run.grain.tenant_id,
            run_id=run.grain.run_id,
            attempt_id=grant.attempt_id,
            holder=grant.holder,
            fencing_token=grant.fencing_token,
            outcome=AttemptOutcome.SUCCEEDED,
            outcome_hash=canonical_hash({"result": 1}),
        )
    )


def completed(container: Container, run: Any) -> RunAggregate:
    """The run loaded (in a unit of work that has ended) with the holder's success decided."""
    with UnitOfWork(container.db, run.tenant) as uow:
        agg = uow.load(run.run_id)
    grant = run.grant
    agg.report_outcome(
        ctx(container),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        AttemptOutcome.SUCCEEDED,
        container.env.options,
        outcome_hash=canonical_hash({"result": 1}),
    )
    return agg


def commit(db: Database, tenant: str, agg: RunAggregate) -> Call:
    def call() -> None:
        with UnitOfWork(db, tenant) as uow:
            uow.commit_changes(agg)

    return call


# ---------------------------------------------------------------------- through the database


def test_outcomes_reported_at_once_commit_whole_in_one_statement(
    container, tenant, make_leased_run, held
):
    """Twelve grains report at once; the eleven that arrive while the first is being sent go
    as one statement, led by the first of them, in run-id order, and each run commits whole.
    Two tenants share the group: each document runs under its own tenant."""
    db = container.db
    tenants = (tenant, f"{tenant}-b")
    runs = [make_leased_run(tenants[i % 2]) for i in range(12)]
    before = {run.run_id: snapshot(db, run.tenant, run.run_id) for run in runs}
    group = held()

    lead, callers = one_group(group, report(runs[0]), [report(run) for run in runs[1:]])

    outcomes = [c.outcome() for c in (lead, *callers)]
    assert [kind for kind, _ in outcomes] == ["ok"] * 12, outcomes
    assert [run_ids(docs) for docs in group.sent] == [
        [runs[0].run_id],
        in_run_order([run.run_id for run in runs[1:]]),
    ]
    assert (group.groups, group.documents) == (2, 12)
    assert group.documents > group.groups
    for run in runs:
        assert_completed_once(db, run.tenant, run.run_id, before[run.run_id])


def test_a_lost_race_fails_alone_in_its_group(container, tenant, make_leased_run, held):
    """A document whose expected version is stale (another unit of work committed to its run
    after it was loaded) is ``ConcurrencyConflict`` to its caller alone: the documents before
    and after it in the same statement commit, and nothing of the loser is visible."""
    db = container.db
    first, leader, loser, last = (make_leased_run(tenant) for _ in range(4))
    stale = completed(container, loser)
    with UnitOfWork(db, tenant) as uow:  # another activation wins: it renews the lease
        winner = uow.load(loser.run_id)
        container.env.clock.advance(1)
        grant = loser.grant
        winner.renew_lease(
            ctx(container),
            grant.attempt_id,
            grant.holder,
            grant.fencing_token,
            container.env.options,
        )
        uow.commit_changes(winner)
    runs = (first, leader, last)
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in (*runs, loser)}
    aggs = [completed(container, run) for run in runs]
    group = held()

    lead, callers = one_group(
        group,
        commit(db, tenant, aggs[0]),
        [commit(db, tenant, aggs[1]), commit(db, tenant, stale), commit(db, tenant, aggs[2])],
    )

    assert lead.outcome()[0] == "ok"
    (k1, _), (kind, exc), (k3, _) = (c.outcome() for c in callers)
    assert (k1, k3) == ("ok", "ok")
    assert kind == "err" and isinstance(exc, errors.ConcurrencyConflict), exc
    assert [run_ids(docs) for docs in group.sent] == [
        [first.run_id],
        in_run_order([leader.run_id, loser.run_id, last.run_id]),
    ]
    assert snapshot(db, tenant, loser.run_id) == before[loser.run_id]
    for run in runs:
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])


def test_a_used_idempotency_key_fails_alone_in_its_group(container, tenant, make_leased_run, held):
    """A submission whose key already names a run is ``DuplicateSubmission`` to its caller
    alone; a new submission and an outcome in the same statement commit."""
    db = container.db
    first, other = make_leased_run(tenant), make_leased_run(tenant)
    existing = submit(
        RunGrain(container.env, tenant, uuid.uuid4()), principal(tenant), request("used-key")
    )
    duplicate = accepted(container, tenant, "used-key")
    fresh = accepted(container, tenant, "fresh-key")
    before = snapshot(db, tenant, other.run_id)
    group = held()

    lead, callers = one_group(
        group,
        report(first),
        [
            commit(db, tenant, completed(container, other)),
            commit(db, tenant, duplicate),
            commit(db, tenant, fresh),
        ],
    )

    assert lead.outcome()[0] == "ok"
    (k1, _), (kind, exc), (k3, _) = (c.outcome() for c in callers)
    assert (k1, k3) == ("ok", "ok")
    assert kind == "err" and isinstance(exc, DuplicateSubmission), exc
    assert [len(docs) for docs in group.sent] == [1, 3]
    assert runs_for_key(db, tenant, "used-key") == [existing.run_id]
    assert not any(snapshot(db, tenant, duplicate.run.run_id).values())
    assert runs_for_key(db, tenant, "fresh-key") == [fresh.run.run_id]
    assert snapshot(db, tenant, fresh.run.run_id)["outbox"][0] == (1, "RunAccepted")
    assert_completed_once(db, tenant, other.run_id, before)


@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_a_fault_in_one_document_rolls_back_only_that_document(
    container, tenant, make_leased_run, held, faults, checkpoint
):
    """A fault fails one document at a checkpoint inside the statement, after some of its
    writes: they roll back with it, its caller (here the second group's leader) gets the
    database's error, and the documents behind it commit."""
    db = container.db
    first, faulty, second, third = (make_leased_run(tenant) for _ in range(4))
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in (faulty, second, third)}
    faults.arm(faulty.run_id, checkpoint)
    group = held()

    lead, callers = one_group(
        group,
        report(first),
        [
            commit(db, tenant, completed(container, faulty)),
            commit(db, tenant, completed(container, second)),
            commit(db, tenant, completed(container, third)),
        ],
    )

    assert lead.outcome()[0] == "ok"
    outcomes = [c.outcome() for c in callers]
    kind, exc = outcomes[0]
    assert kind == "err" and isinstance(exc, psycopg.DatabaseError), outcomes[0]
    assert faults.message(checkpoint) in str(exc)
    assert [kind for kind, _ in outcomes[1:]] == ["ok", "ok"], outcomes
    assert [run_ids(docs) for docs in group.sent][1] == in_run_order(
        [faulty.run_id, second.run_id, third.run_id]
    )
    assert snapshot(db, tenant, faulty.run_id) == before[faulty.run_id]
    for run in (second, third):
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])


def test_a_lost_connection_fails_its_group_as_unavailable_and_a_retry_commits(
    container, tenant, make_leased_run, held, owner_engine: Engine
):
    """The second group's leader loses its connection just before it sends (its backend is
    terminated): every caller of that group gets the retryable ``Unavailable`` through its unit
    of work, nothing of theirs committed, the group before it stands, and retries commit."""
    db = container.db
    runs = [make_leased_run(tenant) for _ in range(4)]
    before = {run.run_id: snapshot(db, tenant, run.run_id) for run in runs}
    terminated: list[int] = []

    def terminate_leader_backend(index: int, send: Sender) -> None:
        if index != 1:
            return

        def terminate(dbapi_connection: Any, record: Any, proxy: Any) -> None:
            pid = dbapi_connection.info.backend_pid  # the connection the send just took
            with owner_engine.connect() as owner:
                # With a timeout it returns once the backend has exited.
                done = owner.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
                assert done.scalar_one()
                owner.commit()
            terminated.append(pid)

        event.listen(db.app, "checkout", terminate, once=True)

    group = held()
    group.before_send = terminate_leader_backend

    lead, callers = one_group(group, report(runs[0]), [report(run) for run in runs[1:]])

    assert lead.outcome()[0] == "ok"
    outcomes = [c.outcome() for c in callers]
    assert [kind for kind, _ in outcomes] == ["err"] * 3, outcomes
    assert all(isinstance(exc, errors.Unavailable) and exc.retryable for _, exc in outcomes)
    assert len(terminated) == 1
    assert [len(docs) for docs in group.sent] == [1, 3]
    assert_completed_once(db, tenant, runs[0].run_id, before[runs[0].run_id])
    for run in runs[1:]:
        assert snapshot(db, tenant, run.run_id) == before[run.run_id]

    for run in runs[1:]:  # each grain reloads and decides again
        assert Caller(report(run)).outcome()[0] == "ok"
    for run in runs[1:]:
        assert_completed_once(db, tenant, run.run_id, before[run.run_id])
    assert (group.groups, group.documents) == (5, 7)


# ---------------------------------------------------------------------- the committer alone


def echo(name: str, log: list[tuple[str, list[str]]]) -> Sender:
    """A sender that records who sent which documents and answers each with its document."""

    def send(docs: list[str]) -> list[Answer]:
        log.append((name, list(docs)))
        return [("OK", doc) for doc in docs]

    return send


def apply(group: GroupCommit, doc: str, send: Sender) -> Call:
    return lambda: group.apply(doc, send)


def test_arrivals_during_a_send_go_next_led_by_the_first_waiting_up_to_max_group():
    """While a group is sent, five documents queue; then each group is led by the first caller
    still waiting, on its own sender, and carries the queue behind it up to the limit; every
    caller gets the answer for its own document."""
    group = HeldGroup(max_group=3)
    log: list[tuple[str, list[str]]] = []

    lead, callers = one_group(
        group,
        apply(group, "d0", echo("s0", log)),
        [apply(group, f"d{i}", echo(f"s{i}", log)) for i in range(1, 6)],
    )

    outcomes = [c.outcome() for c in (lead, *callers)]
    assert outcomes == [("ok", ("OK", f"d{i}")) for i in range(6)]
    assert log == [("s0", ["d0"]), ("s1", ["d1", "d2", "d3"]), ("s4", ["d4", "d5"])]
    assert (group.groups, group.documents) == (3, 6)


def test_a_send_that_fails_fails_its_whole_group_and_the_committer_goes_on():
    """The leader's send raises (its connection was lost): each caller of that group gets that
    error; the caller that queued meanwhile leads the next group, and later lone callers are
    sent at once, also after a failure with nobody waiting (the committer is not left busy)."""
    group = HeldGroup()
    log: list[tuple[str, list[str]]] = []
    lost = psycopg.OperationalError("the connection was lost")
    failing_sends, go_on = threading.Event(), threading.Event()

    def failing(docs: list[str]) -> list[Answer]:
        log.append(("s1", list(docs)))
        failing_sends.set()
        assert go_on.wait(WAIT)
        raise lost

    lead, callers = one_group(
        group,
        apply(group, "d0", echo("s0", log)),
        [apply(group, "d1", failing), apply(group, "d2", echo("s2", log))],
    )
    assert failing_sends.wait(WAIT)
    meanwhile = Caller(apply(group, "d3", echo("s3", log)))
    group.watch.wait_queued(1)
    go_on.set()

    assert lead.outcome() == ("ok", ("OK", "d0"))
    assert [c.outcome() for c in callers] == [("err", lost), ("err", lost)]
    assert meanwhile.outcome() == ("ok", ("OK", "d3"))
    assert Caller(apply(group, "d4", echo("s4", log))).outcome() == ("ok", ("OK", "d4"))
    # A lone caller's failing send, with nobody waiting behind it, leaves the committer idle.
    assert Caller(apply(group, "d5", failing)).outcome() == ("err", lost)
    assert Caller(apply(group, "d6", echo("s6", log))).outcome() == ("ok", ("OK", "d6"))
    assert log == [
        ("s0", ["d0"]),
        ("s1", ["d1", "d2"]),
        ("s3", ["d3"]),
        ("s4", ["d4"]),
        ("s1", ["d5"]),
        ("s6", ["d6"]),
    ]
    assert (group.groups, group.documents) == (6, 7)


def test_a_lone_caller_is_sent_at_once_as_a_group_of_one():
    """Nothing waits for company: a caller with no one else committing sends its document at
    once, on its own sender, and leaves the committer idle for the next one."""
    group = GroupCommit()
    sent: list[tuple[int, list[str]]] = []

    def send(docs: list[str]) -> list[Answer]:
        sent.append((threading.get_ident(), list(docs)))
        return [None]

    def alone(doc: str) -> tuple[int, Answer]:
        return threading.get_ident(), group.apply(doc, send)

    for n, doc in enumerate(("first", "second"), 1):
        kind, value = Caller(lambda doc=doc: alone(doc)).outcome()
        assert kind == "ok", value
        ident, answer = value
        assert answer is None
        assert sent[-1] == (ident, [doc])  # sent by the caller itself, on its own thread
        assert (group.groups, group.documents) == (n, n)
