"""The journal checked row by row against the events (``tests/journal_check.py``, which the
chaos run and the upgrade across 0033 call) finds nothing wrong with the journal the write path
stores, and finds each way of breaking it: an entry gone, entries out of order, an entry no
event of its document stamps, an entry that is not the transition its event records, a
carrier's entries moved to another event, an entry of the old table (before 0033) at a time no
event has, an event row's journal that is not an array of entries. The breaks are made as the
owner with triggers off (the append-only triggers refuse them otherwise:
``test_append_only.py``)."""

from __future__ import annotations

import pytest
from journal_check import journal_breaches
from sqlalchemy import text
from support import report

from runcontrol.domain import AttemptOutcome

# Each break of a run's journal, and the breaches it must show. ``last`` is the seq of the
# run's last event (the run's completion, which carries the last document's entries).
BREAKS = {
    "an entry gone": (
        "UPDATE outbox SET journal = journal - (jsonb_array_length(journal) - 1)"
        " WHERE run_id = :run AND seq = :last",
        {"sequence", "transition without its entry"},
    ),
    "entries out of order": (
        "UPDATE outbox SET journal = jsonb_build_array(journal -> 1, journal -> 0)"
        " || (journal - 0 - 0) WHERE run_id = :run AND seq = :last",
        {"sequence"},
    ),
    "an entry no event stamps": (
        "UPDATE outbox SET journal = jsonb_set(journal, '{0,occurred_at}',"
        " '\"1999-01-01T00:00:00+00:00\"') WHERE run_id = :run AND seq = :last",
        {"entry without its event", "transition without its entry"},
    ),
    "another transition": (
        "UPDATE outbox SET journal = jsonb_set(journal, ARRAY[(jsonb_array_length(journal)"
        " - 1)::text, 'to_state'], '\"Failed\"') WHERE run_id = :run AND seq = :last",
        {"transition without its entry"},
    ),
    "entries on another document's event": (
        "UPDATE outbox o SET journal = CASE o.seq WHEN 1 THEN l.journal END FROM outbox l"
        " WHERE o.run_id = :run AND l.run_id = :run AND l.seq = :last AND o.seq IN (1, :last)",
        {"sequence", "entry without its event", "transition without its entry"},
    ),
    "an entry of the old table no event stamps": (
        "INSERT INTO recovery_journal_legacy (tenant_id, run_id, sequence, entity, entity_id,"
        " from_state, to_state, cause, actor, occurred_at) SELECT tenant_id, run_id, 1, 'Run',"
        " run_id, NULL, 'Accepted', 'SubmitRun', 'alice', '1999-01-01' FROM runs"
        " WHERE run_id = :run",
        {"sequence", "entry without its event"},
    ),
    "not an array of entries": (
        "UPDATE outbox SET journal = '[]' WHERE run_id = :run AND seq = :last",
        {"sequence", "malformed", "transition without its entry"},
    ),
}


def completed_run(make_leased_run, clock, tenant):
    """A run leased, then (a second later: its own clock) completed."""
    run = make_leased_run(tenant)
    clock.advance(1)
    report(run.grain, run.grant, AttemptOutcome.SUCCEEDED, outcome_hash="sha256:" + "0" * 64)
    return run.run_id


def test_the_stored_journal_has_no_breach(make_leased_run, clock, owner_engine, tenant):
    completed_run(make_leased_run, clock, tenant)
    make_leased_run(tenant)  # and one open, leased
    make_leased_run(tenant, lease=False)  # and one pending
    assert journal_breaches(owner_engine, tenant) == []


@pytest.mark.parametrize("name", BREAKS)
def test_each_break_of_the_journal_is_found(make_leased_run, clock, owner_engine, tenant, name):
    run_id = completed_run(make_leased_run, clock, tenant)
    untouched = make_leased_run(tenant).run_id
    statement, wanted = BREAKS[name]
    with owner_engine.begin() as conn:
        last = conn.exec_driver_sql(
            "SELECT max(seq) FROM outbox WHERE run_id = %s", (run_id,)
        ).scalar_one()
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # triggers off
        conn.execute(text(statement), {"run": run_id, "last": last})
    found = journal_breaches(owner_engine, tenant)
    assert {b["breach"] for b in found} == wanted, found
    assert {b["runId"] for b in found} == {str(run_id)}, untouched
