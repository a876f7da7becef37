"""One schema source: every field of every entity survives the real write path, and the
``runcontrol_apply`` function (through the writers it calls, migration 0014) writes every column
of every table it writes.

The comparisons walk ``dataclasses.fields`` and the table metadata, so a field or column added
later is covered without touching this file; ``test_every_optional_field_is_set`` makes the
builders below fail until a new optional field is given a value that is not its default.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, Text, select, text
from support import drive

from runcontrol.config import Settings
from runcontrol.domain import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalState,
    Attempt,
    AttemptOutcome,
    AttemptResult,
    AttemptState,
    AuditRecord,
    CancellationIntent,
    Changes,
    Decision,
    Event,
    FailureClass,
    JournaledCall,
    Lease,
    Limits,
    PolicyRef,
    RecoveryJournalEntry,
    ReleaseRef,
    Run,
    RunAggregate,
    RunState,
    SideEffectClass,
    Step,
    StepState,
    ToolCall,
    ToolCallState,
)
from runcontrol.store import Database, Store, rows
from runcontrol.store.commit import conclude, prepare
from runcontrol.store.tables import (
    RUN_PINS,
    audit_log,
    leases,
    metadata,
    outbox,
    recovery_journal,
)
from runcontrol.store.writers import written_columns

T0 = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def everything(tenant: str) -> Changes:
    """One run with one of every entity, every optional field set (none at its default)."""
    run_id, step_id, attempt_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    lease_id, approval_id = uuid.uuid4(), uuid.uuid4()
    run = Run(
        run_id=run_id,
        tenant_id=tenant,
        project_id="proj-1",
        idempotency_key=f"key-{run_id.hex}",
        workflow_id="wf",
        release=ReleaseRef("rel-1", "sha256:release"),
        policy=PolicyRef("pol-1", "7"),
        model_profile_id="code-agent",
        state=RunState.FAILED,
        input_hash="sha256:input",
        snapshot_id=uuid.uuid4(),
        requested_by="alice",
        created_at=at(0),
        updated_at=at(9),
        environment_id="staging",
        budget_reservation_id=uuid.uuid4(),
        limits=Limits(max_cost_usd=12.25, max_minutes=45),
        deadline_at=at(45),
        failure_class=FailureClass.PERMANENT,
        failure_reason="the step failed",
        outcome_hash="sha256:run-outcome",
        correlation_id="corr-1",
        input={"repo": "x", "nested": {"n": [1, 2.5, None, "s"]}},
        version=4,
        event_seq=3,
        journal_seq=5,
        fencing_seq=2,
        suspended_at=at(8),
        rerun_of=uuid.uuid4(),
        result_hash="sha256:run-result",
        result_bytes=1234,
        priority=5,
        flow=[{"name": "wf", "key": "repo-x", "limit": 1, "strategy": "queue", "scope": "run"}],
        parent_run_id=uuid.uuid4(),
        parent_step_id=uuid.uuid4(),
        depth=2,
        template_id="nightly",
        template_version=3,
        replay_of=uuid.uuid4(),
        replay={"liveCalls": False, "approvals": "park"},
    )
    step = Step(
        step_id=step_id,
        run_id=run_id,
        tenant_id=tenant,
        ordinal=1,
        name="write",
        agent_id="agent-a",
        state=StepState.FAILED,
        max_attempts=3,
        side_effect_class=SideEffectClass.SHARED_WRITE,
        gate="approval",
        skill_id="skill-1",
        not_before=at(2),
        failure_class=FailureClass.PERMANENT,
        outcome_hash="sha256:step-outcome",
        depends_on=["read", "plan"],
        kind="wait",
        wait={"seconds": 5.0},
        due_at=at(3),
        signal={"signalId": "s-1", "body": {"ok": True}, "sentBy": "carol", "receivedAt": "t"},
        flow=[{"name": "wf", "key": "a", "limit": 2, "strategy": "queue", "scope": "attempt"}],
        held={"kind": "concurrency", "name": "wf", "key": "a", "limit": 2, "holders": 2},
        rate_limits=[{"bucket": "tenant", "perSecond": 2.0, "burst": 4.0, "units": 1.0}],
        condition="input.go == true",
        result_json='{"ok":true}',
        child={"runId": str(uuid.uuid4()), "number": 1},
    )
    attempt = Attempt(
        attempt_id=attempt_id,
        step_id=step_id,
        run_id=run_id,
        tenant_id=tenant,
        number=2,
        state=AttemptState.FAILED,
        dispatched_at=at(3),
        lease_id=lease_id,
        fencing_token=2,
        holder="worker-1",
        outcome=AttemptOutcome.FAILED,
        outcome_hash="sha256:attempt-outcome",
        failure_class=FailureClass.PERMANENT,
        settled_at=at(8),
        settled_by="worker-1",
        progress_seq=7,
    )
    lease = Lease(
        lease_id=lease_id,
        attempt_id=attempt_id,
        run_id=run_id,
        tenant_id=tenant,
        holder="worker-1",
        fencing_token=2,
        granted_at=at(4),
        expires_at=at(6),
        released_at=at(8),
        release_cause="outcome",
    )
    approval = ApprovalRequest(
        approval_id=approval_id,
        run_id=run_id,
        step_id=step_id,
        attempt_id=attempt_id,
        tenant_id=tenant,
        action_class=SideEffectClass.SHARED_WRITE,
        proposal_hash="sha256:proposal",
        policy_revision="7",
        approver_rule="reviewers",
        required_approvals=2,
        requested_by="worker-1",
        created_at=at(5),
        expires_at=at(65),
        state=ApprovalState.REJECTED,
        decided_by="rita",
        decided_at=at(7),
        reason="too risky",
        version=3,
    )
    decision = ApprovalDecision(
        approval_id=approval_id,
        run_id=run_id,
        tenant_id=tenant,
        decided_by="rita",
        decision=Decision.REJECT,
        proposal_hash="sha256:proposal",
        reason="too risky",
        break_glass=True,
        decided_at=at(7),
        pre_approval=0,
    )
    intent = CancellationIntent(
        intent_id=uuid.uuid4(),
        run_id=run_id,
        tenant_id=tenant,
        requested_by="alice",
        reason="no longer needed",
        requested_at=at(8),
    )
    tool_call = ToolCall(
        tool_call_id=uuid.uuid4(),
        run_id=run_id,
        tenant_id=tenant,
        call_id="call-1",
        attempt_id=attempt_id,
        request_hash="sha256:request",
        claimed_by="worker-1",
        fencing_token=2,
        claimed_at=at(5),
        expires_at=at(10),
        state=ToolCallState.EXPIRED,
        result_hash="sha256:result",
        completed_at=at(10),
        error="timed out",
        result_json='{"pr":7}',
    )
    call = JournaledCall(
        run_id=run_id,
        step_id=step_id,
        name="model",
        occurrence=2,
        tenant_id=tenant,
        attempt_id=attempt_id,
        fencing_token=2,
        value_hash="sha256:call",
        bytes=12,
        recorded_at=at(6),
        value_json='{"plan":"é ü"}',
        error={"type": "Permanent", "message": "no", "failure_class": "permanent"},
        request_hash="sha256:call-arguments",
    )
    result = AttemptResult(
        attempt_id=attempt_id,
        step_id=step_id,
        run_id=run_id,
        tenant_id=tenant,
        outcome_hash="sha256:attempt-outcome",
        bytes=33,
        created_at=at(8),
        result_json='{"big":100000000000000000000,"f":1e+300,"s":"\\u0000 \u00e9"}',
        result_ref={"uri": "s3://bucket/key", "sha256": "ab" * 32, "bytes": 12},
        command_id="report-1",
        fingerprint="sha256:the-report",
    )
    event = Event(
        event_id=uuid.uuid4(),
        run_id=run_id,
        tenant_id=tenant,
        project_id="proj-1",
        seq=1,
        event_type="RunFailed",
        topic="run-control.runs.v1.run-failed",
        payload={"runId": str(run_id), "why": ["a", 1, True]},
        occurred_at=at(9),
        step_id=step_id,
        attempt_id=attempt_id,
        correlation_id="corr-1",
        causation_id="cause-1",
        producer="runcontrol-test",
        schema_version=2,
    )
    journal = RecoveryJournalEntry(
        run_id=run_id,
        tenant_id=tenant,
        sequence=1,
        entity="Run",
        entity_id=run_id,
        from_state="Running",
        to_state="Failed",
        cause="step-failed",
        actor="worker-1",
        occurred_at=at(9),
    )
    audit = AuditRecord(
        tenant_id=tenant,
        run_id=run_id,
        kind="break-glass",
        actor="rita",
        detail={"reason": "too risky", "n": 2},
        occurred_at=at(7),
    )
    return Changes(
        run=run,
        expected_version=None,
        steps={step_id: step},
        attempts={attempt_id: attempt},
        leases={lease_id: lease},
        approvals={approval_id: approval},
        decisions=[decision],
        intents=[intent],
        tool_calls={tool_call.tool_call_id: tool_call},
        results=[result],
        calls=[call],
        events=[event],
        journal=[journal],
        audits=[audit],
        run_dirty=True,
    )


class Prepared(RunAggregate):
    """An aggregate whose pending changes are the given ones (a new run and all its rows)."""

    def __init__(self, changes: Changes) -> None:
        super().__init__(changes.run, changes.steps.values(), is_new=True)
        self._prepared: Changes | None = changes

    def take_changes(self) -> Changes:
        changes, self._prepared = self._prepared, None
        assert changes is not None
        return changes


def stored_template(db: Database, tenant: str, changes: Changes) -> None:
    """The template version ``everything``'s run names, stored: its vote uses the version's
    pre-approval 0, which the vote's trigger counts (``runcontrol_template_use``)."""
    with db.tenant(tenant) as conn:
        conn.execute(
            text(
                "INSERT INTO run_templates (template_id, version, tenant_id, project_id,"
                " workflow_id, release_alias, state, content_hash, content, created_by,"
                " created_at, break_glass, updated_at) VALUES (:template, :version, :tenant,"
                " :project, 'wf', 'latest', 'Active', 'sha256:t', CAST(:content AS jsonb),"
                " 'ann', now(), false, now())"
            ),
            {
                "template": changes.run.template_id,
                "version": changes.run.template_version,
                "tenant": tenant,
                "project": changes.run.project_id,
                "content": json.dumps({"preApprovals": [{"maxUses": 5}]}),
            },
        )


def entities(changes: Changes) -> list[Any]:
    return [
        changes.run,
        *changes.steps.values(),
        *changes.attempts.values(),
        *changes.leases.values(),
        *changes.approvals.values(),
        *changes.decisions,
        *changes.intents,
        *changes.tool_calls.values(),
        *changes.results,
        *changes.calls,
        *changes.events,
        *changes.journal,
        *changes.audits,
    ]


def assert_same_fields(expected: Any, actual: Any) -> None:
    assert type(actual) is type(expected)
    for f in dataclasses.fields(expected):
        want, got = getattr(expected, f.name), getattr(actual, f.name)
        assert got == want, f"{type(expected).__name__}.{f.name}: {got!r} != {want!r}"
        assert type(got) is type(want), f"{type(expected).__name__}.{f.name}: {type(got)}"


def test_every_optional_field_is_set(tenant):
    """The builder sets every defaulted field (a new one fails here until it is given a value),
    and every entity a document writes is in it."""
    built = entities(everything(tenant))
    assert {type(e) for e in built} == set(rows.MAPPERS)
    for entity in built:
        for f in dataclasses.fields(entity):
            if not f.metadata.get("stored", True):
                continue  # memory only (Event.body): no column to round-trip
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                continue
            assert getattr(entity, f.name) != default, f"{type(entity).__name__}.{f.name}"


@pytest.fixture
def store(db) -> Iterator[Store]:
    opened = Store(db.app_url, size=1)
    yield opened
    drive(opened.close())


def test_every_field_survives_commit_and_load(db, store, tenant):
    """Through the write path (``prepare``, ``Store.send``) and back (``Store.load``, and the
    tables the aggregate does not load read as the tenant)."""
    changes = everything(tenant)
    expected = copy.deepcopy(changes)
    stored_template(db, tenant, changes)
    pending = prepare(tenant, Prepared(changes), Settings().options())
    assert pending is not None
    (answer,) = drive(store.send([pending.doc]))
    conclude(pending, answer)
    run_id = expected.run.run_id

    agg, _ = drive(store.load(tenant, run_id, T0))
    with db.tenant(tenant) as conn:
        # The lease was released, so the aggregate does not load it; the trail is not loaded.
        by_table = {
            table: [
                rows.from_row(cls, r) for r in conn.execute(select(table).filter_by(run_id=run_id))
            ]
            for cls, table in (
                (Lease, leases),
                (Event, outbox),
                (RecoveryJournalEntry, recovery_journal),
                (AuditRecord, audit_log),
            )
        }

    loaded = [
        agg.run,
        *agg.steps,
        *agg.attempts.values(),
        *by_table[leases],
        *agg.approvals.values(),
        *(d for ds in agg.decisions.values() for d in ds),
        *agg.intents,
        *agg.tool_calls.values(),
        *agg.results.values(),
        *agg.calls.values(),
        *by_table[outbox],
        *by_table[recovery_journal],
        *by_table[audit_log],
    ]
    want = entities(expected)
    assert [type(e) for e in loaded] == [type(e) for e in want]
    for w, got in zip(want, loaded, strict=True):
        assert_same_fields(w, got)


@dataclasses.dataclass
class Widget:
    widget_id: uuid.UUID
    name: str


def test_a_field_or_column_without_its_pair_fails_when_the_mapper_is_built():
    def table(*extra: Column[Any]) -> Table:
        return Table("widgets", MetaData(), Column("widget_id", Text), Column("name", Text), *extra)

    rows._Mapper(Widget, table())  # matched: builds
    with pytest.raises(TypeError, match=r"columns without a field \['colour'\]"):
        rows._Mapper(Widget, table(Column("colour", Text)))
    with pytest.raises(TypeError, match=r"fields without a column \['name'\]"):
        rows._Mapper(Widget, Table("widgets", MetaData(), Column("widget_id", Text)))


# ---------------------------------------------------------------------- runcontrol_apply


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",")]


def _assigned(text: str) -> list[str]:
    """The columns of ``a = x.a, b = x.b``."""
    return [n.split("=")[0].strip() for n in _names(text)]


def missing_columns(function: str, tables: list[Table]) -> list[str]:
    """Each column of ``tables`` that one of the function's column lists for it leaves out:
    the INSERT's, its SELECT's, and the SET of its upsert (or of the run's guarded UPDATE),
    which names every column but the primary key (and, for the run's UPDATE, its pins)."""
    missing = []
    for table in tables:
        name, columns = table.name, written_columns(table)
        insert = re.search(
            rf"INSERT INTO {name} \((?P<cols>[^)]*)\)\s+SELECT\s(?P<select>.*?) FROM "
            rf"jsonb_populate_record(?:set)?\(NULL::{name}, [^)]*\)(?P<rest>[^;]*);",
            function,
            re.S,
        )
        if insert is None:
            missing.append(f"{name} (no INSERT)")
            continue
        checks = {"INSERT": _names(insert["cols"]), "SELECT": _names(insert["select"])}
        upsert = re.search(r"DO UPDATE SET\s(?P<set>.*)", insert["rest"], re.S)
        if upsert is not None:
            checks["ON CONFLICT SET"] = _assigned(upsert["set"])
        update = re.search(rf"UPDATE {name} SET\s(?P<set>.*?)\s+FROM ", function, re.S)
        if update is not None:
            checks["UPDATE SET"] = _assigned(update["set"])
        for where, listed in checks.items():
            column = table.c
            wanted = [
                c
                for c in columns
                if not (where.endswith("SET") and column[c].primary_key)
                and not (where == "UPDATE SET" and column[c].info.get("pinned"))
            ]
            missing += [f"{name}.{c} ({where})" for c in wanted if c not in listed]
    return missing


def apply_tables(target: MetaData = metadata) -> list[Table]:
    """The tables a document writes through ``runcontrol_apply``: one per row mapper (the
    journal's is a view: its entries are written in their event's row, 0033)."""
    return [
        target.tables[m.table.name] for m in rows.MAPPERS.values() if m.table.name in target.tables
    ]


@pytest.fixture
def apply_definition(owner_engine) -> str:
    """The text of ``runcontrol_apply`` and of every function it can call (its writers)."""
    with owner_engine.connect() as conn:
        return "\n".join(
            conn.exec_driver_sql(
                "SELECT pg_get_functiondef(oid) FROM pg_proc"
                " WHERE proname LIKE 'runcontrol%%' AND prokind = 'f' ORDER BY proname"
            ).scalars()
        )


def test_apply_function_names_every_column_it_writes(apply_definition):
    assert missing_columns(apply_definition, apply_tables()) == []


def test_apply_function_check_is_not_vacuous(apply_definition):
    changed = copy.deepcopy(metadata)
    for name in ("runs", "steps", "outbox"):
        changed.tables[name].append_column(Column("added_later", Text))
    assert missing_columns(apply_definition, apply_tables(changed)) == [
        "runs.added_later (INSERT)",
        "runs.added_later (SELECT)",
        "runs.added_later (UPDATE SET)",
        "steps.added_later (INSERT)",
        "steps.added_later (SELECT)",
        "steps.added_later (ON CONFLICT SET)",
        "steps.added_later (UPDATE SET)",  # its patch (issue 42)
        "outbox.added_later (INSERT)",
        "outbox.added_later (SELECT)",
    ]


def test_the_run_update_leaves_the_pins_out(apply_definition):
    """Invariant 2: the run's UPDATE names none of the pinned columns (a trigger refuses the
    change of one from any other statement: ``test_writers``)."""
    update = re.search(r"UPDATE runs SET\s(?P<set>.*?)\s+FROM ", apply_definition, re.S)
    assert update is not None
    assigned = set(_assigned(update["set"]))
    assert assigned.isdisjoint(RUN_PINS)
    assert RUN_PINS == (
        "release_id",
        "policy_revision",
        "model_profile_id",
        "snapshot_id",
        "priority",  # flow control (0017): pinned with the submission
        "flow",
        "parent_run_id",  # child runs (0024): the lineage is pinned at acceptance
        "parent_step_id",
        "depth",
        "template_id",  # the template version a run came from (0032), pinned since 0038
        "template_version",
        "replay_of",  # a replay's original and options (0037), pinned since 0038
        "replay",
    )
