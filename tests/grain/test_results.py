"""Results: an outcome's result is stored once, hashed by the server, capped, carried to the
steps that depend on it, and becomes the run's result (real Postgres, the grain driven
directly)."""

from __future__ import annotations

import dataclasses

import pytest
from grain_harness import Harness
from sqlalchemy import select
from support import fenced, report

from runcontrol.commands import ReportOutcome
from runcontrol.config import ResultOptions, Settings
from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    RunState,
    StepSpec,
    canonical_hash,
    canonical_json,
    errors,
)
from runcontrol.store.tables import attempt_results, runs

TWO = (StepSpec("plan", "planner"), StepSpec("apply", "applier"))
# Numbers jsonb would rewrite, a NUL escape, non-ASCII, nesting: the bytes must survive.
RESULT = {"plan": ["a.py", "b.py"], "big": 10**20, "f": 1e300, "x": 0.1, "s": "\u0000 é"}


def results_of(h: Harness, run_id) -> list:
    return h.rows(attempt_results, run_id)


def test_a_result_is_hashed_by_the_server_and_reaches_the_next_step(h: Harness):
    grain, grant = h.start_run(*TWO)
    attempt = report(grain, grant, AttemptOutcome.SUCCEEDED, result=RESULT)
    assert attempt.outcome_hash == canonical_hash(RESULT)
    (row,) = results_of(h, grain.run_id)
    assert row.result_json.encode() == canonical_json(RESULT)
    assert row.bytes == len(canonical_json(RESULT))

    # The next step's grant carries it (from the cache, and from a fresh load alike).
    second = h.lease(grain)
    for agg in (grain.grain.agg, h.load(grain.run_id)):
        assert agg is not None
        got = agg.grant_results(second.attempt_id)
        assert canonical_json(got["plan"]) == canonical_json(RESULT)


def test_the_run_result_is_the_final_steps(h: Harness):
    grain, grant = h.start_run(*TWO)
    report(grain, grant, AttemptOutcome.SUCCEEDED, result={"n": 1})
    final = {"summary": "done", "files": 2}
    report(grain, h.lease(grain), AttemptOutcome.SUCCEEDED, result=final)
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.COMPLETED
    assert agg.run.result_hash == canonical_hash(final)
    assert agg.run.result_bytes == len(canonical_json(final))
    (completed,) = [e for e in h.outbox(grain.run_id) if e.event_type == "RunCompleted"]
    assert completed.payload["resultHash"] == canonical_hash(final)


def test_a_resent_report_stores_the_result_once(h: Harness):
    grain, grant = h.start_run(*TWO)
    command = ReportOutcome(
        **fenced(grant, h.tenant), outcome=AttemptOutcome.SUCCEEDED, result=RESULT
    )
    first = grain.execute(command)
    assert grain.execute(command) == first  # the memo answers it
    assert h.grain(grain.run_id).execute(command) == first  # a fresh activation too
    # The same report under a new command id is the same report retried: no new row either.
    again = dataclasses.replace(command, command_id="another-id")
    assert h.grain(grain.run_id).execute(again).outcome_hash == first.outcome_hash
    assert len(results_of(h, grain.run_id)) == 1


def test_a_sent_hash_that_differs_is_refused(h: Harness):
    grain, grant = h.start_run(*TWO)
    with pytest.raises(errors.OutcomeHashMismatch):
        report(
            grain,
            grant,
            AttemptOutcome.SUCCEEDED,
            result=RESULT,
            outcome_hash=canonical_hash({"other": 1}),
        )
    assert results_of(h, grain.run_id) == []
    # The right one is accepted.
    report(
        grain, grant, AttemptOutcome.SUCCEEDED, result=RESULT, outcome_hash=canonical_hash(RESULT)
    )
    assert len(results_of(h, grain.run_id)) == 1


def test_an_over_cap_result_is_refused_and_the_attempt_stays_open(make_harness):
    h = make_harness(Settings(results=ResultOptions(max_inline_bytes=1024)))
    grain, grant = h.start_run(*TWO)
    with pytest.raises(errors.ResultTooLarge) as refused:
        report(grain, grant, AttemptOutcome.SUCCEEDED, result={"blob": "x" * 2000})
    assert refused.value.code == "result-too-large"
    assert results_of(h, grain.run_id) == []
    assert h.load(grain.run_id).attempt(grant.attempt_id).state is AttemptState.LEASED
    # ... so its holder reports a reference instead.
    ref = {"uri": "file:///tmp/blob", "sha256": "ab" * 32, "bytes": 2000}
    attempt = report(grain, grant, AttemptOutcome.SUCCEEDED, result_ref=ref)
    assert attempt.outcome_hash == canonical_hash(ref)
    (row,) = results_of(h, grain.run_id)
    assert row.result_ref == ref and row.result_json is None and row.bytes == 2000
    second = h.lease(grain)
    assert h.load(grain.run_id).grant_results(second.attempt_id) == {"plan": ref}


def test_a_report_without_a_result_works_as_before(h: Harness):
    grain, grant = h.start_run(*TWO)
    h.succeed(grain, grant)
    h.succeed(grain, h.lease(grain), 2)
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.COMPLETED and agg.run.result_hash is None
    assert results_of(h, grain.run_id) == []
    with h.db.tenant(h.tenant) as conn:
        assert conn.execute(select(runs.c.result_bytes)).scalar() is None
