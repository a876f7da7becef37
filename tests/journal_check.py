"""The journal checked row by row against the events (issue 42, migration 0033; DESIGN.md
section 6, invariants 3 and 11): what ``journal_breaches`` finds wrong with a tenant's journal.

Since 0033 a document's journal entries are carried by its last event (``outbox.journal``,
``rows.journal_entries``; a previous release's document is folded alike by
``runcontrol_fold_journal``), and the entries written before it stay in
``recovery_journal_legacy``. A document's events are consecutive in its run (seq a..b) and its
entries sit on b; every command stamps its events and its entries with the same ``occurred_at``
(its context's clock). So, per run of the tenant:

- **sequence**: the run's entries, those of the old table by sequence and then those on its
  event rows in the order of the events' seq and of their place in the array, are exactly
  1..``runs.journal_seq``: each once, none missing, in commit order;
- **entry without its event**: an entry on an event row has an event of its own document, that
  is with its ``occurred_at`` among the events after the previous carrying event up to the one
  that carries it; an entry of the old table, an event of the run with its ``occurred_at``;
- **transition without its entry**: every event that records a transition (``TRANSITIONS``)
  finds the entry of that transition (entity, id, from and to state where the event says them)
  with its ``occurred_at`` among the entries of its document: those of the first carrying event
  at or after it, or (written before 0033) those of the old table;
- **malformed**: an event row's ``journal`` is a non-empty array when it is not NULL.

The chaos run (``chaos_checks.check``) and the upgrade across 0033 (``tests/actors/
test_upgrade_across_0033.py``) call it; ``tests/store/test_journal_check.py`` proves it finds
each kind of breach.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, text

ANY = object()  # the entry's state may be any
SETTLED = object()  # an attempt's state after its outcome: none of the open ones
OPEN_ATTEMPT = frozenset({"Dispatched", "Leased", "Parked"})

# Event type -> the journal entry it implies: (entity, its id, from state, to state). The id is
# a column of the event row or (``$``) a key of its payload; a state is a literal, None (the
# entity's first entry), ANY, SETTLED or (``$``) a key of the payload.
TRANSITIONS: dict[str, tuple[str, str, Any, Any]] = {
    "RunAccepted": ("Run", "run_id", None, "Accepted"),
    "RunStateChanged": ("Run", "run_id", "$fromState", "$toState"),
    "AttemptDispatched": ("Attempt", "attempt_id", None, "Dispatched"),
    "LeaseGranted": ("Attempt", "attempt_id", ANY, "Leased"),
    "AttemptParked": ("Attempt", "attempt_id", ANY, "Parked"),
    "AttemptResumed": ("Attempt", "attempt_id", "Parked", "Dispatched"),
    "AttemptOutcomeRecorded": ("Attempt", "attempt_id", ANY, SETTLED),
    "StepRetryScheduled": ("Step", "step_id", ANY, "Pending"),
    "StepSkipped": ("Step", "step_id", ANY, "Skipped"),
    "ApprovalRequested": ("ApprovalRequest", "$approvalId", None, "Pending"),
    "ApprovalDecided": ("ApprovalRequest", "$approvalId", ANY, "$state"),
    "ToolCallClaimed": ("ToolCall", "$toolCallId", None, "$state"),
    "ToolCallCompleted": ("ToolCall", "$toolCallId", ANY, "Completed"),
    "ToolCallExpired": ("ToolCall", "$toolCallId", ANY, "Expired"),
}

_EVENTS = text(
    "SELECT run_id, seq, event_type, occurred_at, step_id::text, attempt_id::text, payload,"
    " journal, jsonb_typeof(journal) AS kind, jsonb_array_length(CASE jsonb_typeof(journal)"
    " WHEN 'array' THEN journal END) AS n FROM outbox WHERE tenant_id = :t ORDER BY run_id, seq"
)
_CARRIED = text(
    "SELECT o.run_id, o.seq, e.n, j.sequence, j.entity, j.entity_id::text, j.from_state,"
    " j.to_state, j.occurred_at FROM outbox o"
    " CROSS JOIN LATERAL jsonb_array_elements(CASE jsonb_typeof(o.journal) WHEN 'array'"
    " THEN o.journal END) WITH ORDINALITY AS e(v, n)"
    " CROSS JOIN LATERAL jsonb_to_record(e.v) AS j(sequence bigint, entity text, entity_id uuid,"
    " from_state text, to_state text, occurred_at timestamptz)"
    " WHERE o.tenant_id = :t AND o.journal IS NOT NULL ORDER BY o.run_id, o.seq, e.n"
)
_LEGACY = text(
    "SELECT run_id, NULL AS seq, 0 AS n, sequence, entity, entity_id::text, from_state,"
    " to_state, occurred_at FROM recovery_journal_legacy WHERE tenant_id = :t"
    " ORDER BY run_id, sequence"
)
_RUNS = text("SELECT run_id, journal_seq FROM runs WHERE tenant_id = :t")


def journal_breaches(engine: Engine, tenant: str, limit: int = 50) -> list[dict[str, Any]]:
    """Every breach of the journal's rules (module doc) among ``tenant``'s runs, read as the
    owner (``engine``); empty when the journal is whole. At most ``limit`` are described."""
    with engine.connect() as conn:
        params = {"t": tenant}
        events = defaultdict(list)
        for e in conn.execute(_EVENTS, params):
            events[e.run_id].append(e)
        carried = defaultdict(list)
        for j in conn.execute(_CARRIED, params):
            carried[j.run_id].append(j)
        legacy = defaultdict(list)
        for j in conn.execute(_LEGACY, params):
            legacy[j.run_id].append(j)
        counters = {r.run_id: r.journal_seq for r in conn.execute(_RUNS, params)}
    found: list[dict[str, Any]] = []
    for run_id in sorted(set(counters) | set(events) | set(carried) | set(legacy), key=str):
        found += _run_breaches(
            run_id, counters.get(run_id), events[run_id], carried[run_id], legacy[run_id]
        )
        if len(found) >= limit:
            break
    return found[:limit]


def _run_breaches(
    run_id: Any, counter: int | None, events: list[Any], carried: list[Any], legacy: list[Any]
) -> list[dict[str, Any]]:
    run = str(run_id)
    found: list[dict[str, Any]] = []
    sequences = [j.sequence for j in (*legacy, *carried)]
    if counter is None or sequences != list(range(1, counter + 1)):
        found.append(
            {"runId": run, "breach": "sequence", "journalSeq": counter, "sequences": sequences}
        )
    for e in events:
        if e.journal is not None and (e.kind != "array" or not e.n):
            found.append({"runId": run, "breach": "malformed", "seq": e.seq, "journal": e.journal})
    # Each carrying event's document: the events after the previous carrier, up to it.
    entries_on: dict[int, list[Any]] = defaultdict(list)
    for j in carried:
        entries_on[j.seq].append(j)
    carriers = sorted(entries_on)
    span: dict[int, set[Any]] = defaultdict(set)  # carrier seq -> its document's clocks
    document: dict[int, int] = {}  # event seq -> its carrier's seq
    at = 0
    for e in events:
        while at < len(carriers) and carriers[at] < e.seq:
            at += 1
        if at < len(carriers):
            document[e.seq] = carriers[at]
            span[carriers[at]].add(e.occurred_at)
    clocks = {e.occurred_at for e in events}
    for j in carried:
        if j.occurred_at not in span[j.seq]:
            found.append(_entry(run, "entry without its event", j))
    for j in legacy:
        if j.occurred_at not in clocks:
            found.append(_entry(run, "entry without its event", j))
    for e in events:
        rule = TRANSITIONS.get(e.event_type)
        if rule is None or e.payload is None:  # no transition, or past the events' horizon
            continue
        want = _wanted(rule, e)
        candidates = [*entries_on.get(document.get(e.seq, -1), ()), *legacy]
        if not any(j.occurred_at == e.occurred_at and _matches(want, j) for j in candidates):
            found.append(
                {
                    "runId": run,
                    "breach": "transition without its entry",
                    "seq": e.seq,
                    "eventType": e.event_type,
                    "wanted": [w if isinstance(w, str | None) else "*" for w in want],
                }
            )
    return found


def _value(spec: Any, event: Any) -> Any:
    if isinstance(spec, str) and spec.startswith("$"):
        return event.payload.get(spec[1:])
    return spec


def _wanted(rule: tuple[str, str, Any, Any], event: Any) -> tuple[Any, ...]:
    entity, id_spec, from_spec, to_spec = rule
    entity_id = _value(id_spec, event) if id_spec.startswith("$") else getattr(event, id_spec)
    return entity, str(entity_id), _value(from_spec, event), _value(to_spec, event)


def _matches(want: tuple[Any, ...], entry: Any) -> bool:
    entity, entity_id, from_state, to_state = want
    if (entry.entity, entry.entity_id) != (entity, entity_id):
        return False
    if from_state is not ANY and entry.from_state != from_state:
        return False
    if to_state is SETTLED:
        return entry.to_state not in OPEN_ATTEMPT
    return to_state is ANY or entry.to_state == to_state


def _entry(run: str, breach: str, j: Any) -> dict[str, Any]:
    return {
        "runId": run,
        "breach": breach,
        "seq": j.seq,
        "sequence": j.sequence,
        "entity": j.entity,
        "toState": j.to_state,
        "occurredAt": str(j.occurred_at),
    }
