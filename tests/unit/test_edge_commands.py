"""The outside commands' builders (``runcontrol.edge.commands``) without a server: what they
refuse before they read anything, and the commands they make. Both doors call them
(``tests/api/test_two_doors.py`` sends the same bad input through HTTP and gRPC)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from runcontrol.commands import SendSignal, SubmitRun
from runcontrol.domain import Limits, Principal, Role, errors
from runcontrol.domain.access import RUNS_WRITE, effective_scopes, scopes_of
from runcontrol.domain.limits import MAX_DEPTH
from runcontrol.domain.shards import hashed_vshard, vshard_of
from runcontrol.edge import commands
from runcontrol.edge.auth import Caller
from runcontrol.edge.errors import IdempotencyKeyRequired, InsufficientScope, RequestInvalid
from runcontrol.edge.storable import storable_json
from runcontrol.store import Database

# Never connected to: every refusal below comes before the builder's first read.
UNUSED = Database("postgresql+psycopg://unused@localhost/unused")
RUN = uuid.uuid4()


def outside(*roles: Role, scopes: Any = None, door: str = "http") -> commands.Outside:
    granted = scopes_of(roles) if scopes is None else scopes
    principal = Principal("alice", "t-1", "p-1", frozenset(roles))
    return commands.Outside(Caller(principal, effective_scopes(roles, granted)), UNUSED, door)


def signal(o: commands.Outside, key: str | None = "k", name: str = "go", body: Any = None) -> Any:
    return asyncio.run(commands.send_signal(o, key, run_id=RUN, name=name, body=body))


@pytest.mark.parametrize(
    ("roles", "scopes", "refusal"),
    [
        ((Role.OBSERVER,), None, InsufficientScope),
        ((Role.OBSERVER,), [RUNS_WRITE], InsufficientScope),  # its roles do not grant it
        ((Role.WORKER,), None, InsufficientScope),
        ((Role.OPERATOR,), None, errors.Forbidden),  # the scope (it cancels), not the operation
        ((Role.REQUESTER,), [], InsufficientScope),
    ],
)
def test_a_signal_needs_the_submitters_operation(
    roles: tuple[Role, ...], scopes: Any, refusal: type[Exception]
) -> None:
    with pytest.raises(refusal):
        signal(outside(*roles, scopes=scopes))


@pytest.mark.parametrize(
    ("key", "name", "body", "refusal"),
    [
        (None, "go", None, IdempotencyKeyRequired),
        ("  ", "go", None, IdempotencyKeyRequired),
        ("k", "", None, errors.ValidationFailed),
        ("k", "x" * 201, None, errors.ValidationFailed),
        ("k", "g\x00o", None, errors.ValidationFailed),
        ("k", "go", {"a": "\x00"}, RequestInvalid),
        ("k", "go", {"\ud800": 1}, RequestInvalid),
        ("k", "go", {"a": "x" * 65_536}, errors.ValidationFailed),  # over 64 KiB canonical
    ],
)
def test_a_signal_is_checked_before_anything_is_read(
    key: str | None, name: str, body: Any, refusal: type[Exception]
) -> None:
    with pytest.raises(refusal):
        signal(outside(Role.REQUESTER), key, name, body)


def test_a_signal_of_a_tenant_wide_caller_is_the_command_its_key_names() -> None:
    command = signal(outside(Role.WORKSPACE_ADMIN, door="grpc"), "k-1", body={"ok": 1})
    assert command == SendSignal(
        tenant_id="t-1",
        run_id=RUN,
        command_id=f"grpc:alice:SendSignal:go:{RUN}:k-1",
        name="go",
        body={"ok": 1},
        sent_by="alice",
    )


def test_the_command_id_is_the_key_scoped_to_door_caller_operation_and_target() -> None:
    o = outside(Role.REQUESTER)
    assert o.command_id("CancelRun", RUN, "k") == f"http:alice:CancelRun:{RUN}:k"
    assert o.command_id("CancelRun", RUN, None) != o.command_id("CancelRun", RUN, None)


def test_a_priority_above_the_default_is_an_operators_decision() -> None:
    fields: dict[str, Any] = {"workflow_id": "wf", "model_profile_id": "m", "input": {}}
    limits = Limits()
    with pytest.raises(errors.Forbidden):
        commands.submit_run(
            outside(Role.REQUESTER), "k", correlation_id=None, limits=limits, priority=4, **fields
        )
    with pytest.raises(IdempotencyKeyRequired):
        commands.submit_run(
            outside(Role.REQUESTER), None, correlation_id=None, limits=limits, **fields
        )
    run = commands.submit_run(
        outside(Role.WORKSPACE_ADMIN), "k", correlation_id="c", limits=limits, priority=5, **fields
    )
    assert isinstance(run, SubmitRun)
    assert vshard_of(run.run_id) == hashed_vshard("t-1")  # the run's id: in its tenant's shard
    assert (run.request.project_id, run.request.idempotency_key, run.request.priority) == (
        "p-1",
        "k",
        5,
    )


def test_storable_json_bounds_depth_and_text() -> None:
    deep: Any = 0
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert storable_json(deep) is deep
    with pytest.raises(ValueError, match="deeper"):
        storable_json([deep])
    with pytest.raises(ValueError, match="NUL"):
        storable_json({"ok": ["fine", {"k\x00": 1}]})
