"""``commit_together``: several runs' commands committed as one group, each answered alone.

A run host runs the first command of each cached run in a batch this way (``RunHost.
command_batch``): every round, the documents the transitions have ready go in one statement; a
transition that lost its race reloads and decides again in the next round, exactly as when its
command is called alone. Each test runs twice: through ``commit_together`` and
``Database.send_documents`` (a thread blocks on the statement), and through
``commit_together_async`` and ``AsyncDocumentSender`` (an event loop awaits it, as the hosts
do). On real grains and the real database; ``sent`` counts the statements and documents sent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from grain_harness import WORKER, Harness, outcome_hash
from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool
from support import Faults

from runcontrol.commands import (
    AcquireLease,
    CancelRun,
    OpenAttempts,
    RenewLease,
    ReportOutcome,
    SubmitRun,
    WakeRun,
)
from runcontrol.domain import Attempt, AttemptOutcome, LeaseGrant, RunState, StepSpec, errors
from runcontrol.grain import (
    RunGrain,
    Transition,
    batches,
    commit_together,
    commit_together_async,
)
from runcontrol.store.async_send import APPLICATION_NAME, AsyncDocumentSender


class Committer:
    """Commits transitions together one way or the other, and can break its next connection."""

    def __init__(self, h: Harness, mode: str) -> None:
        self.h, self.mode = h, mode
        self.loop = asyncio.new_event_loop()
        self.sender = AsyncDocumentSender(h.db)
        self.thread_hops = 0  # event loop: how often steps that block were sent to a thread

    def __call__(self, transitions: list[Transition[Any]]) -> list[tuple[bool, Any]]:
        if self.mode == "blocking":
            return commit_together(self.h.db, transitions)

        async def on_thread(steps: Callable[[], None]) -> None:
            self.thread_hops += 1
            loop_thread = threading.get_ident()

            def run() -> None:
                assert threading.get_ident() != loop_thread
                steps()

            await asyncio.to_thread(run)

        return self.loop.run_until_complete(
            commit_together_async(self.sender.send, transitions, on_thread)
        )

    def lose_next_connection(self, owner_url: str) -> None:
        """The connection the next group is sent on dies first (its backend is terminated)."""
        owner = create_engine(owner_url, poolclass=NullPool)

        def terminate(pids: str, params: dict[str, Any]) -> None:
            with owner.connect() as conn:  # with a timeout it returns once they have exited
                conn.execute(text(f"SELECT pg_terminate_backend(pid, 10000) FROM {pids}"), params)
                conn.commit()
            owner.dispose()

        if self.mode == "blocking":
            event.listen(
                self.h.db.app,
                "checkout",
                lambda dbapi_connection, record, proxy: terminate(
                    "(SELECT :pid AS pid) p", {"pid": dbapi_connection.info.backend_pid}
                ),
                once=True,
            )
        else:  # the sender's pool holds one connection, already open
            self.loop.run_until_complete(self.sender.open())
            terminate("pg_stat_activity WHERE application_name = :name", {"name": APPLICATION_NAME})

    def close(self) -> None:
        self.loop.run_until_complete(self.sender.close())
        self.loop.close()


@pytest.fixture(params=["blocking", "event-loop"])
def together(h: Harness, request: pytest.FixtureRequest) -> Iterator[Committer]:
    committer = Committer(h, request.param)
    yield committer
    committer.close()


@pytest.fixture
def sent(h: Harness) -> Iterator[Callable[[], tuple[int, int]]]:
    """(statements, documents) sent through ``send_documents`` since the fixture started."""
    start = (h.db.statements_sent, h.db.documents_sent)
    yield lambda: (h.db.statements_sent - start[0], h.db.documents_sent - start[1])


def leased_runs(h: Harness, n: int) -> list[tuple[RunGrain, LeaseGrant]]:
    """``n`` runs of a one-step workflow, each leased to WORKER through its own cached grain."""
    h.publish(StepSpec("only", "agent-a"))
    runs = []
    for _ in range(n):
        grain, _ = h.submit()
        runs.append((grain, h.lease(grain)))
    return runs


def succeed(grain: RunGrain, grant: LeaseGrant, token: int | None = None) -> Any:
    return grain.transition(
        ReportOutcome(
            tenant_id=grain.tenant_id,
            run_id=grain.run_id,
            attempt_id=grant.attempt_id,
            holder=grant.holder,
            fencing_token=grant.fencing_token if token is None else token,
            outcome=AttemptOutcome.SUCCEEDED,
            outcome_hash=outcome_hash(),
        )
    )


def test_cached_runs_commit_in_one_statement_and_each_gets_its_answer(
    h: Harness, sent, together
) -> None:
    runs = leased_runs(h, 5)
    before = sent()

    answers = together([succeed(grain, grant) for grain, grant in runs])

    assert sent()[0] - before[0] == 1 and sent()[1] - before[1] == 5
    assert together.thread_hops == 0  # cached and nothing to read: no step left the loop
    for (grain, grant), (ok, attempt) in zip(runs, answers, strict=True):
        assert ok and isinstance(attempt, Attempt), attempt
        assert (attempt.attempt_id, str(attempt.state)) == (grant.attempt_id, "Succeeded")
        agg = h.load(grain.run_id)
        assert agg.run.state is RunState.COMPLETED
        assert h.event_types(grain.run_id)[-1] == "RunCompleted"
        journal = h.journal(grain.run_id)
        assert [j.sequence for j in journal] == list(range(1, len(journal) + 1))
        assert journal[-1].to_state == "Completed"


def test_a_refusal_and_a_failed_document_answer_only_their_own_callers(
    h: Harness, sent, together, faults: Faults
) -> None:
    """A stale fencing token is refused before any write (audited); a document that fails
    inside the database (an injected fault) rolls back alone; the others in the group commit.
    The runs are given in descending id order, the reverse of the order the group writes them,
    so an answer handed to the wrong caller shows. On the event loop, the refusal's audit and
    the fresh activation's load ran on a thread."""
    runs = sorted(leased_runs(h, 3), key=lambda run: run[0].run_id, reverse=True)
    (stale, stale_grant), (faulty, faulty_grant), (fine, fine_grant) = runs

    faults.arm(faulty.run_id, "before-journal")
    faulty_grain = RunGrain(h.env, h.tenant, faulty.run_id)  # a fresh activation
    before = sent()

    refused, failed, committed = together(
        [
            succeed(stale, stale_grant, token=stale_grant.fencing_token + 1),
            succeed(faulty_grain, faulty_grant),
            succeed(fine, fine_grant),
        ],
    )

    assert refused[0] is False and isinstance(refused[1], errors.StaleFencingToken)
    assert failed[0] is False and isinstance(failed[1], psycopg.DatabaseError), failed
    assert faults.message("before-journal") in str(failed[1])
    assert committed[0] is True
    assert sent()[0] - before[0] == 1  # the two documents written went together
    assert together.thread_hops >= (0 if together.mode == "blocking" else 1)
    assert len(h.audits(stale.run_id, "stale-fencing-token")) == 1
    for grain in (stale, faulty):
        assert h.load(grain.run_id).run.state is RunState.RUNNING
        assert [e for e in h.event_types(grain.run_id) if e == "AttemptOutcomeRecorded"] == []
    assert h.load(fine.run_id).run.state is RunState.COMPLETED


def test_a_nul_in_one_commands_text_fails_that_command_alone(h: Harness, together) -> None:
    """PostgreSQL text cannot hold NUL: sent, such a document would fail its whole group (the
    array cast fails). It is refused before it is sent, as a validation error for its caller."""
    h.publish(StepSpec("only", "agent-a"))
    bad, _ = h.submit()
    (_, fine_grant), *_ = leased_runs(h, 1)
    fine = h.grain(fine_grant.run_id)
    (attempt,) = h.open_attempts(bad.run_id)

    refused, committed = together(
        [
            bad.transition(
                AcquireLease(
                    tenant_id=bad.tenant_id,
                    run_id=bad.run_id,
                    attempt_id=attempt.attempt_id,
                    holder="w\x00",
                )
            ),
            succeed(fine, fine_grant),
        ]
    )

    assert refused[0] is False and isinstance(refused[1], errors.ValidationFailed)
    assert committed[0] is True
    assert h.load(bad.run_id).leases == {}
    assert h.load(fine.run_id).run.state is RunState.COMPLETED


def test_a_lost_race_decides_again_on_fresh_rows_in_the_next_round(
    h: Harness, sent, together
) -> None:
    """Another activation renews the lease first: this activation's cached document loses the
    version guard, so it reloads, decides again and commits in a second, smaller round."""
    (racer, grant), (other, other_grant) = leased_runs(h, 2)
    h.grain(racer.run_id).execute(
        RenewLease(
            tenant_id=h.tenant,
            run_id=racer.run_id,
            attempt_id=grant.attempt_id,
            holder=WORKER,
            fencing_token=grant.fencing_token,
        )
    )
    version = h.load(racer.run_id).run.version
    before = sent()

    (won, renewed), (ok, _) = together(
        [
            racer.transition(
                RenewLease(
                    tenant_id=racer.tenant_id,
                    run_id=racer.run_id,
                    attempt_id=grant.attempt_id,
                    holder=WORKER,
                    fencing_token=grant.fencing_token,
                )
            ),
            succeed(other, other_grant),
        ],
    )

    assert won and ok and isinstance(renewed, LeaseGrant)
    assert (sent()[0] - before[0], sent()[1] - before[1]) == (2, 3)
    assert h.load(racer.run_id).run.version == version + 1
    assert h.load(other.run_id).run.state is RunState.COMPLETED


def test_a_lost_connection_answers_every_transition_unavailable_and_a_retry_commits(
    h: Harness, owner_url: str, together
) -> None:
    """The group's connection dies just before it is used: nobody knows what committed, so
    every transition answers the retryable ``Unavailable``; nothing was written, and the same
    commands sent again commit."""
    runs = leased_runs(h, 3)
    together.lose_next_connection(owner_url)

    answers = together([succeed(grain, grant) for grain, grant in runs])

    for ok, error in answers:
        assert ok is False and isinstance(error, errors.Unavailable) and error.retryable
    for grain, _ in runs:
        assert h.load(grain.run_id).run.state is RunState.RUNNING
    again = together([succeed(grain, grant) for grain, grant in runs])
    assert [ok for ok, _ in again] == [True] * 3
    for grain, _ in runs:
        assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_only_batching_commands_run_as_transitions(h: Harness) -> None:
    (grain, _), *_ = leased_runs(h, 1)
    address = {"tenant_id": grain.tenant_id, "run_id": grain.run_id}
    for command in (
        SubmitRun(**address, principal=h.principal(), request=h.request()),
        WakeRun(**address),
        OpenAttempts(**address),
    ):
        assert not batches(command)
        with pytest.raises(ValueError):
            grain.transition(command)
    assert batches(CancelRun(**address, requested_by="ops", reason="stop"))


def test_the_empty_group_sends_nothing(h: Harness, sent, together) -> None:
    assert together([]) == []
    assert sent() == (0, 0)
