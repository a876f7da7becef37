"""The MCP server's tools: each one a read the HTTP API answers (its route's own function)
or an outside command made by its builder in ``edge.commands``, so the permission, the
visibility, the idempotency key, the input's checks and the rule are those of every door.

A tool is a row of ``TOOLS``: its name, what it does, its arguments (a pydantic model: the
tool's input schema, and their check, a tool error naming the field), the operation it
performs (``domain.access``: the door refuses a token without its scope with 403 before the
call, ``door``) and its answer's view (the HTTP API's response model). A published workflow
that opts in as an agent (its ``agent`` block) is a tool of its own (``workflow_tool``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

from schemas.api import (
    ApprovalPage,
    ApprovalView,
    CancelRunRequest,
    CancelRunResponse,
    DecisionRequest,
    EventEnvelope,
    JsonObject,
    Name,
    OutputChunkView,
    RunPage,
    RunView,
    SignalResponse,
    SubmitRunRequest,
    SubmitRunResponse,
)

from ..api import approvals, events, output, runs
from ..api.context import Services
from ..domain import ApprovalState, Limits, RunState
from ..domain.access import Operation
from ..domain.agent import AgentExposure
from ..edge import commands
from ..edge.auth import Caller
from ..edge.commands import Outside
from ..store import queries as q
from .watch import Progress, watch

WORKFLOW_TOOL = "workflow."  # a published workflow's own tool: this and its id
MAX_KEY = 255


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: the verified caller, as the sender of outside commands through this
    door (``outside``: door ``mcp``, the tenant's command rate), the key a command without
    an ``idempotencyKey`` argument takes (made from the MCP request, ``door``) and where its
    progress goes."""

    caller: Caller
    outside: Outside
    svc: Services
    request_key: str
    progress: Progress


class Arguments(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)


Key = Annotated[
    str | None,
    Field(
        None,
        min_length=1,
        max_length=MAX_KEY,
        description="The idempotency key: a retry with the same key answers as the first call "
        "did. Without it, one made from the MCP request (its id and arguments).",
    ),
]
Wait = Annotated[
    float | None,
    Field(
        None,
        ge=0,
        description="Seconds to wait for the run to end (at most the server's "
        "`api.prefer_wait_max_seconds`, as `Prefer: wait`); its events and output come as "
        "progress notifications meanwhile.",
    ),
]
Limit = Annotated[int, Field(50, ge=1, le=200)]
Cursor = Annotated[str | None, Field(None, max_length=1000)]


class StartRun(SubmitRunRequest):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)
    idempotency_key: Key
    correlation_id: str | None = Field(None, min_length=1, max_length=200)


class StartRunAndWait(StartRun):
    wait_seconds: Wait


class RunId(Arguments):
    run_id: UUID


class WaitRun(RunId):
    wait_seconds: Wait
    after: int = Field(0, ge=0, le=events.MAX_SEQ, description="The last event seq seen.")
    after_position: int = Field(
        0, ge=0, le=events.MAX_SEQ, description="The last output position seen."
    )


class ListRuns(Arguments):
    state: list[RunState] | None = None
    workflow_id: Name | None = None
    parent_run_id: UUID | None = None
    cursor: Cursor
    limit: Limit


class ReadRun(RunId):
    after: int = Field(0, ge=0, le=events.MAX_SEQ, description="The last seq/position seen.")
    limit: int = Field(100, ge=1, le=events.REPLAY_BATCH)


class ListApprovals(Arguments):
    state: list[ApprovalState] | None = None
    run_id: UUID | None = None
    cursor: Cursor
    limit: Limit


class SendSignal(RunId):
    name: Name
    body: Any = Field(description="The signal step's result: any JSON value but null.")
    idempotency_key: Key


class CancelRun(CancelRunRequest):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)
    run_id: UUID
    idempotency_key: Key


class DecideApproval(DecisionRequest):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)
    approval_id: UUID
    idempotency_key: Key


WorkflowInput: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)


Run = Callable[[Call, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    parse: Callable[[dict[str, Any]], Any]  # the arguments checked (pydantic's errors)
    operation: Operation
    run: Run
    view: Any  # the answer's type, as the HTTP API shows it

    def answer(self, value: Any) -> Any:
        """The answer as JSON, shaped as the HTTP API's response model shows it."""
        adapter: TypeAdapter[Any] = TypeAdapter(self.view)
        shown = adapter.validate_python(value, from_attributes=True)
        return adapter.dump_python(shown, mode="json", by_alias=True)


def tool(
    name: str,
    description: str,
    arguments: type[BaseModel],
    operation: Operation,
    run: Run,
    view: Any,
) -> Tool:
    """A tool whose arguments are the model ``arguments`` (its JSON Schema the input's)."""
    schema = arguments.model_json_schema(by_alias=True)
    return Tool(name, description, schema, arguments.model_validate, operation, run, view)


def _key(call: Call, given: str | None) -> str:
    return given or call.request_key


async def _submitted(call: Call, a: StartRun) -> Any:
    fields = a.model_dump(include=set(SubmitRunRequest.model_fields) - {"limits"})
    command = commands.submit_run(
        call.outside,
        _key(call, a.idempotency_key),
        correlation_id=a.correlation_id,
        limits=Limits(**a.limits.model_dump()),
        **fields,
    )
    return await call.svc.send(command)


async def _start_and_wait(call: Call, a: StartRunAndWait) -> Any:
    result = await _submitted(call, a)
    return await watch(call.svc, call.caller, result.run_id, a.wait_seconds, call.progress)


async def _wait(call: Call, a: WaitRun) -> Any:
    after = (a.after, a.after_position)
    return await watch(call.svc, call.caller, a.run_id, a.wait_seconds, call.progress, after)


async def _get(call: Call, a: RunId) -> Any:
    return await runs.get_run(call.caller, call.svc, a.run_id)


async def _list(call: Call, a: ListRuns) -> Any:
    return await runs.list_runs(
        call.caller, call.svc, a.state, a.workflow_id, a.parent_run_id, a.cursor, a.limit
    )


async def _events(call: Call, a: ReadRun) -> Any:
    page = events.RunPage(a.run_id, a.after, a.limit)
    return await events.get_run_event_history(call.caller, call.svc, page)


async def _output(call: Call, a: ReadRun) -> Any:
    page = events.RunPage(a.run_id, a.after, a.limit)
    return await output.get_run_output(call.caller, call.svc, page)


async def _approvals(call: Call, a: ListApprovals) -> Any:
    return await approvals.list_approvals(
        call.caller, call.svc, a.state, a.run_id, a.cursor, a.limit
    )


async def _signal(call: Call, a: SendSignal) -> Any:
    key = _key(call, a.idempotency_key)
    build = commands.send_signal(call.outside, key, run_id=a.run_id, name=a.name, body=a.body)
    return await call.svc.send(await build)


async def _cancel(call: Call, a: CancelRun) -> Any:
    key = _key(call, a.idempotency_key)
    build = commands.cancel_run(call.outside, key, run_id=a.run_id, reason=a.reason)
    return {"runId": a.run_id, "state": await call.svc.send(await build)}


async def _decide(call: Call, a: DecideApproval) -> Any:
    fields = a.model_dump(exclude={"approval_id", "idempotency_key"})
    build = commands.decide_approval(
        call.outside, _key(call, a.idempotency_key), approval_id=a.approval_id, **fields
    )
    approval = await call.svc.send(await build)
    return q.approval_view(asdict(approval))


TOOLS = {
    t.name: t
    for t in (
        tool(
            "start_run",
            "Start a run of a published workflow; answers its id and state at once. "
            "Idempotent on idempotencyKey.",
            StartRun,
            Operation.SUBMIT_RUN,
            _submitted,
            SubmitRunResponse,
        ),
        tool(
            "start_run_and_wait",
            "Start a run and wait (bounded) for it to end, its events and output sent as "
            "progress; answers the run as get_run does (not yet ended: wait_run goes on).",
            StartRunAndWait,
            Operation.SUBMIT_RUN,
            _start_and_wait,
            RunView,
        ),
        tool(
            "wait_run",
            "Wait (bounded) for a run to end, its events and output after a seq and a "
            "position sent as progress.",
            WaitRun,
            Operation.READ_RUNS,
            _wait,
            RunView,
        ),
        tool(
            "get_run",
            "A run: its state, steps, attempts, pending approvals and result.",
            RunId,
            Operation.READ_RUNS,
            _get,
            RunView,
        ),
        tool(
            "list_runs", "Runs, newest first; paged.", ListRuns, Operation.READ_RUNS, _list, RunPage
        ),
        tool(
            "read_events",
            "A run's events after a seq (0: from the start), in order.",
            ReadRun,
            Operation.READ_RUNS,
            _events,
            list[EventEnvelope],
        ),
        tool(
            "read_output",
            "A run's streamed output after a position (0: from the start), in order.",
            ReadRun,
            Operation.READ_RUNS,
            _output,
            list[OutputChunkView],
        ),
        tool(
            "list_approvals",
            "Approval requests visible to the caller (pending and decided), newest first.",
            ListApprovals,
            Operation.READ_APPROVALS,
            _approvals,
            ApprovalPage,
        ),
        tool(
            "send_signal",
            "Send a run's signal step its input (the step's result).",
            SendSignal,
            Operation.SUBMIT_RUN,
            _signal,
            SignalResponse,
        ),
        tool(
            "cancel_run",
            "Record the intent to cancel a run; the state observed is answered.",
            CancelRun,
            Operation.CANCEL_RUN,
            _cancel,
            CancelRunResponse,
        ),
    )
}
# Offered only when the tenant's policy says so (``mcpDecisions``): every rule of a decision
# holds (never the run's requester, the proposal hash and version, break-glass audited).
DECIDE = tool(
    "decide_approval",
    "Approve, reject or request changes on the exact proposal version (never the run's "
    "requester's decision).",
    DecideApproval,
    Operation.DECIDE_APPROVAL,
    _decide,
    ApprovalView,
)


@dataclass(frozen=True, slots=True)
class Exposed:
    """A workflow whose newest release opts in as an agent: the release a call submits."""

    workflow_id: str
    release_id: str
    exposure: AgentExposure


def workflow_tool(w: Exposed) -> Tool:
    """The workflow as a tool: its arguments are the run's input (the agent block's input
    schema); a call starts the workflow's newest release and waits for it as
    ``start_run_and_wait`` does."""

    async def start(call: Call, run_input: dict[str, Any]) -> Any:
        command = commands.submit_run(
            call.outside,
            call.request_key,
            correlation_id=None,
            limits=Limits(),
            workflow_id=w.workflow_id,
            release_id=w.release_id,
            model_profile_id=w.exposure.model_profile_id,
            input=w.exposure.checked(run_input),
        )
        result = await call.svc.send(command)
        return await watch(call.svc, call.caller, result.run_id, None, call.progress)

    exposure = w.exposure
    return Tool(
        WORKFLOW_TOOL + w.workflow_id,
        f"{exposure.name}: {exposure.description}",
        exposure.tool_schema(),
        WorkflowInput.validate_python,
        Operation.SUBMIT_RUN,
        start,
        RunView,
    )
