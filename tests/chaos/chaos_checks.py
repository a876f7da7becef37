"""The invariants a chaos run must keep, checked in the database after it (``check``), and
what the run waits on before it stops (every committed event published, the relay's state)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from journal_check import journal_breaches
from sqlalchemy import Engine, text

TERMINAL = ("Completed", "Failed", "Cancelled")


@contextmanager
def _conn(engine: Engine) -> Iterator[Any]:
    with engine.connect() as conn:
        yield conn


def check(engine: Engine, tenant: str, accepted: dict[str, str], refusals: Path) -> dict[str, Any]:
    """Every invariant the chaos run must keep; each list names its breaches (empty: kept)."""
    t = {"t": tenant}
    with _conn(engine) as conn:

        def rows(sql: str) -> list[Any]:
            return list(conn.execute(text(sql), t))

        runs = {
            str(r.run_id): r
            for r in rows(
                "SELECT run_id, state, failure_class, failure_reason, event_seq "
                "FROM runs WHERE tenant_id = :t"
            )
        }
        wanted = set(accepted.values())
        lost = [
            {"runId": r, "state": runs[r].state if r in runs else None}
            for r in sorted(wanted)
            if r not in runs or runs[r].state not in TERMINAL
        ]
        extra = sorted(set(runs) - wanted)
        # Each Uncertain attempt: whether its holder ever acted on it (asked for approval), and
        # how its lease ended.
        settled_uncertain = {
            str(r.run_id): {
                "attemptId": str(r.attempt_id),
                "holder": r.holder,
                "settledBy": r.settled_by,
                "approvalRequested": bool(r.asked),
                "grantedAt": float(r.granted) if r.granted is not None else None,
                "settledAt": float(r.settled) if r.settled is not None else None,
            }
            for r in rows(
                "SELECT a.run_id, a.attempt_id, l.holder, a.settled_by, "
                "extract(epoch FROM l.granted_at) AS granted, "
                "extract(epoch FROM a.settled_at) AS settled, EXISTS (SELECT 1 "
                "FROM approval_requests q WHERE q.attempt_id = a.attempt_id) AS asked "
                "FROM attempts a LEFT JOIN leases l USING (attempt_id) "
                "WHERE a.tenant_id = :t AND a.state = 'Uncertain'"
            )
        }
        uncertain = [
            {"runId": r, "reason": runs[r].failure_reason, **settled_uncertain.get(r, {})}
            for r in sorted(wanted & set(runs))
            if runs[r].state == "Failed" and runs[r].failure_class == "uncertain"
        ]
        other = [
            {
                "runId": r,
                "state": runs[r].state,
                "failureClass": runs[r].failure_class,
                "reason": runs[r].failure_reason,
            }
            for r in sorted(wanted & set(runs))
            if runs[r].state in TERMINAL
            and runs[r].state != "Completed"
            and not (runs[r].state == "Failed" and runs[r].failure_class == "uncertain")
        ]
        # Invariant 5: one accepted outcome per attempt, seen three ways.
        double_journal = rows(
            "SELECT entity_id, count(*) FROM recovery_journal WHERE tenant_id = :t "
            "AND entity = 'Attempt' AND to_state NOT IN ('Dispatched', 'Leased', 'Parked') "
            "GROUP BY entity_id HAVING count(*) > 1"
        )
        double_events = rows(
            "SELECT attempt_id, count(*) FROM outbox WHERE tenant_id = :t "
            "AND event_type = 'AttemptOutcomeRecorded' GROUP BY attempt_id HAVING count(*) > 1"
        )
        double_success = rows(
            "SELECT step_id, count(*) FROM attempts WHERE tenant_id = :t "
            "AND state = 'Succeeded' GROUP BY step_id HAVING count(*) > 1"
        )
        # Invariant 11: per run, seqs 1..n, each once, the run's counter at n.
        seqs = {
            str(r.run_id): r
            for r in rows(
                "SELECT run_id, count(*) AS n, count(DISTINCT seq) AS d, min(seq) AS lo, "
                "max(seq) AS hi FROM outbox WHERE tenant_id = :t GROUP BY run_id"
            )
        }
        gaps = []
        for run_id, run in runs.items():
            s = seqs.get(run_id)
            if s is None or not (s.n == s.d == s.hi == run.event_seq and s.lo == 1):
                gaps.append(
                    {"runId": run_id, "eventSeq": run.event_seq, **(s._asdict() if s else {})}
                )
        # Settled runs hold nothing: budget, leases, open attempts, pending approvals.
        held_budget = rows(
            "SELECT b.run_id FROM budget_reservations b JOIN runs r USING (run_id) "
            "WHERE r.tenant_id = :t AND r.state IN ('Completed', 'Failed', 'Cancelled') "
            "AND b.released_at IS NULL"
        )
        reserved = rows("SELECT count(*) FROM budget_reservations WHERE tenant_id = :t")[0][0]
        open_leases = rows(
            "SELECT l.lease_id FROM leases l JOIN runs r USING (run_id) WHERE r.tenant_id = :t "
            "AND r.state IN ('Completed', 'Failed', 'Cancelled') AND l.released_at IS NULL"
        )
        open_attempts = rows(
            "SELECT a.attempt_id FROM attempts a JOIN runs r USING (run_id) WHERE "
            "r.tenant_id = :t AND r.state IN ('Completed', 'Failed', 'Cancelled') "
            "AND a.state IN ('Dispatched', 'Leased')"
        )
        approvals = {
            state: int(n)
            for state, n in rows(
                "SELECT state, count(*) FROM approval_requests WHERE tenant_id = :t GROUP BY state"
            )
        }
        # Invariant 5, the audit half: every stale report refused is on record.
        audited = {
            (r.attempt_id, int(r.fencing_token))
            for r in rows(
                "SELECT detail->>'attempt_id' AS attempt_id, detail->>'fencing_token' AS "
                "fencing_token FROM audit_log WHERE tenant_id = :t "
                "AND detail ? 'attempt_id' AND detail ? 'fencing_token'"
            )
        }
    refused = [json.loads(line) for line in refusals.read_text().splitlines() if line.strip()]
    unaudited = [
        r
        for r in refused
        if r["outcome"] != "accepted" and (r["attempt_id"], r["fencing_token"]) not in audited
    ]
    zombies = [r for r in refused if r["zombie"]]
    return {
        "accepted": len(wanted),
        "runs": len(runs),
        "completed": sum(1 for r in wanted & set(runs) if runs[r].state == "Completed"),
        "uncertain": uncertain,
        "lost": lost,
        "extra_runs": extra,
        "other_terminal": other,
        "double_outcomes": [str(r[0]) for r in (*double_journal, *double_events, *double_success)],
        "event_gaps": gaps,
        "journal_breaches": journal_breaches(engine, tenant),  # row by row against the events
        "budget_held_by_terminal_runs": [str(r[0]) for r in held_budget],
        "budget_reservations": int(reserved),
        "open_leases_of_terminal_runs": [str(r[0]) for r in open_leases],
        "open_attempts_of_terminal_runs": [str(r[0]) for r in open_attempts],
        "approvals": approvals,
        "stale_reports_refused": len(refused) - len(zombies),
        "zombie_reports": len(zombies),
        "zombie_reports_accepted": [r for r in zombies if r["outcome"] == "accepted"],
        "refusals_not_audited": unaudited,
    }


def breaches(report: dict[str, Any]) -> list[str]:
    """What the run got wrong, in words; empty when every invariant held."""
    c = report["checks"]
    found = []
    for key in (
        "lost",
        "extra_runs",
        "other_terminal",
        "double_outcomes",
        "event_gaps",
        "journal_breaches",
        "budget_held_by_terminal_runs",
        "open_leases_of_terminal_runs",
        "open_attempts_of_terminal_runs",
        "zombie_reports_accepted",
        "refusals_not_audited",
    ):
        if c[key]:
            found.append(f"{key}: {c[key][:10]}")
    if report["error"]:
        found.append(f"the load stopped: {report['error']}")
    if report["submit_refused"]:
        found.append(f"submissions refused: {report['submit_refused'][:10]}")
    if not report["settled"]:
        found.append("not every accepted run was terminal within the settle timeout")
    for f in report["faults"]:
        if f["recovered_s"] is None:
            found.append(f"no recovery after {f['kind']} at {f['at_s']}s: {f['detail']}")
    if c.get("outbox_unpublished"):
        found.append(f"{c['outbox_unpublished']} committed events never published")
    if report["options"]["zombie_rate"] > 0 and not c["zombie_reports"]:
        found.append("no zombie report was sent: the stale-token check proved nothing")
    if c["budget_reservations"] != c["accepted"]:
        found.append(f"{c['budget_reservations']} budget reservations for {c['accepted']} runs")
    return found


def wait_published(engine: Engine, tenant: str, timeout_s: float) -> int:
    """The tenant's outbox rows still unpublished once the relay had ``timeout_s`` to publish
    them (publication is never proof: a relay killed mid-batch republishes it, and in the end
    every committed event must be published)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _conn(engine) as conn:
            left = int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM outbox WHERE tenant_id = :t AND published_at IS NULL"
                    ),
                    {"t": tenant},
                ).scalar_one()
            )
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def scheduler_processes() -> list[str]:
    """Every scheduler process on the machine (``ray::Scheduler``), with its pid and age."""
    out = subprocess.run(
        ["ps", "-eo", "pid,ppid,etimes,stat,args"], capture_output=True, text=True, check=False
    ).stdout
    return [line.strip()[:160] for line in out.splitlines() if "Scheduler" in line]


def stuck_publication(engine: Engine, tenant: str) -> dict[str, Any]:
    """What held the relay back, when committed events stayed unpublished: the unpublished
    rows' range, every database session (its client, state, wait and transaction age), and
    who holds or waits for locks."""
    with _conn(engine) as conn:
        rows = conn.execute(
            text(
                "SELECT count(*) AS n, min(id) AS first, max(id) AS last, min(occurred_at) AS "
                "oldest FROM outbox WHERE tenant_id = :t AND published_at IS NULL"
            ),
            {"t": tenant},
        ).one()
        sessions = conn.execute(
            text(
                "SELECT pid, application_name AS app, state, wait_event_type AS wait_type, "
                "wait_event AS wait, round(extract(epoch FROM now() - xact_start)) AS xact_s, "
                "round(extract(epoch FROM now() - backend_start)) AS age_s, left(query, 160) "
                "AS query FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() ORDER BY backend_start"
            )
        ).all()
        locks = conn.execute(
            text(
                "SELECT pid, locktype, mode, granted, relation::regclass::text AS relation, "
                "objid, count(*) AS n FROM pg_locks WHERE pid <> pg_backend_pid() "
                "AND locktype IN ('advisory', 'transactionid', 'tuple', 'relation') "
                "GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1"
            )
        ).all()
    return {
        "unpublished": {k: str(v) for k, v in rows._mapping.items()},
        "sessions": [dict(r._mapping) for r in sessions],
        "locks": [dict(r._mapping) for r in locks if r.locktype != "relation" or not r.granted],
    }
