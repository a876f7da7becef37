"""A replay's divergence report, read (docs/replay.md): the replay run and its original, each
read as the grain loads a run (``commit.LOAD``), compared by ``domain.replay.report``."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from ..domain import RunAggregate, errors
from ..domain.replay import Outcome, RunRecord, report
from .commit import LOAD, aggregate


def load(conn: Connection, run_id: UUID) -> RunAggregate:
    """The run and its rows, in the caller's scope (``RunNotFound`` outside it)."""
    found = [list(conn.exec_driver_sql(sql, (run_id,)).mappings()) for _, sql in LOAD]
    return aggregate(run_id, [[dict(r) for r in rs] for rs in found])


def record(agg: RunAggregate) -> RunRecord:
    """What the report compares of a run: by step name, its result, calls and approvals."""
    names = {s.step_id: s.name for s in agg.steps}
    approvals: dict[str, list[Any]] = {}
    for a in agg.approvals.values():
        approvals.setdefault(names[a.step_id], []).append(a)
    return RunRecord(
        agg.run.run_id,
        str(agg.run.state),
        {s.name: Outcome.of(s.outcome_hash, agg.step_result(s)) for s in agg.steps},
        {(names[c.step_id], c.name, c.occurrence): c for c in agg.calls.values()},
        {name: tuple(found) for name, found in approvals.items()},
        {s.name: None if s.failure_class is None else str(s.failure_class) for s in agg.steps},
    )


def replay_report(conn: Connection, run_id: UUID) -> dict[str, Any]:
    """The report of the replay ``run_id`` against its original (404: not a replay)."""
    replay = load(conn, run_id)
    if replay.run.replay_of is None:
        raise errors.RunNotFound(f"run {run_id} is not a replay: it has no replay report")
    original = load(conn, replay.run.replay_of)
    found = report(record(original), record(replay))
    return {**found, "replay": replay.run.replay}
