"""``RunTaskStore``: a2a-sdk's ``TaskStore`` over runs. A task is read from its run, under
row-level security in the caller's tenant and project, each time; it is never saved: a
task changes only through its run's commands (``RunTaskHandler``), so there is no second
copy of its state to drift, and any replica reads any task, after any restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any, TypeVar
from uuid import UUID

from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task, TaskState
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length
from sqlalchemy import Connection

from ..api.context import Services
from ..domain import RunState, errors
from ..domain.access import Operation
from ..edge.auth import Caller, permit
from ..edge.commands import Outside
from ..edge.errors import (
    ApiError,
    InsufficientScope,
    Overloaded,
    RateLimited,
    TooManySubscribers,
)
from ..edge.metering import TenantRateLimiter
from ..store import queries as q
from . import tasks
from .cards import Agent

T = TypeVar("T")
# Refusals that did nothing and may succeed on a retry (HTTP 429/503).
TRANSIENT = (errors.Unavailable, errors.Draining, Overloaded, RateLimited, TooManySubscribers)
PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
# ListTasks: the run states that may show each task state (INPUT_REQUIRED and REJECTED are
# then told from the run itself).
_RUN_STATES: dict[int, tuple[RunState, ...]] = {
    TaskState.TASK_STATE_SUBMITTED: (RunState.ACCEPTED,),
    TaskState.TASK_STATE_WORKING: (RunState.RUNNING, RunState.CANCELLING),
    TaskState.TASK_STATE_INPUT_REQUIRED: (RunState.RUNNING, RunState.WAITING_FOR_APPROVAL),
    TaskState.TASK_STATE_COMPLETED: (RunState.COMPLETED,),
    TaskState.TASK_STATE_FAILED: (RunState.FAILED,),
    TaskState.TASK_STATE_REJECTED: (RunState.FAILED,),
    TaskState.TASK_STATE_CANCELED: (RunState.CANCELLED,),
}


@dataclass(frozen=True, slots=True)
class Call:
    """One A2A call: the verified caller and the agent (the workflow) it addresses, both put
    in the call's context by the door (``routes``)."""

    caller: Caller
    agent: Agent
    outside: Outside


def a2a_error(error: errors.RunControlError) -> A2AError:
    """The A2A error for a refusal (the same refusal HTTP answers with its problem)."""
    data = {"code": error.code, "retryable": error.retryable}
    if isinstance(error, TRANSIENT):  # did nothing; retry (A2A has no code of its own)
        return InternalError(str(error), data | {"retryable": True})
    if isinstance(error, errors.NotFound):
        return TaskNotFoundError(str(error), data)
    if isinstance(error, errors.Forbidden | InsufficientScope):
        return InvalidRequestError(str(error), data)
    if isinstance(error, errors.ValidationFailed | ApiError):
        return InvalidParamsError(str(error), data)
    if isinstance(error, errors.Conflict | errors.ApprovalGone):
        return UnsupportedOperationError(str(error), data)
    return InternalError(str(error), data)


def check_status(raw: object) -> None:
    """ListTasks' ``status`` as the client sent it (a name, or a number): a task state, else
    ``InvalidParams``. a2a-sdk's JSON parsers drop an unknown name (the request would then
    list every task), so its bindings check the raw parameter first (``routes``); gRPC's
    unknown number arrives as it was sent."""
    if isinstance(raw, str) and raw in TaskState.keys():
        return
    try:
        number = None if isinstance(raw, bool) else int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        number = None
    if number not in TaskState.values():
        raise InvalidParamsError(
            f"status must be a task state ({', '.join(TaskState.keys()[1:])}), not {raw!r}"
        )


class RunTaskStore(TaskStore):
    def __init__(self, services: Services, rate_limiter: TenantRateLimiter) -> None:
        self.svc = services
        self.rate_limiter = rate_limiter

    def call(self, context: ServerCallContext) -> Call:
        """The call's caller and agent, which the door (``routes``) put in its context."""
        caller: Caller = context.state["caller"]
        agent: Agent = context.state["agent"]
        if context.tenant and context.tenant != caller.tenant_id:
            # A tenant is the token's: another one named is as unknown as its tasks are.
            raise TaskNotFoundError(f"no agent {agent.workflow_id!r} in tenant {context.tenant!r}")
        return Call(caller, agent, Outside(caller, self.svc.db, "a2a", self.rate_limiter))

    async def read(self, call: Call, query: Callable[[Connection], T]) -> T:
        """``query`` in the caller's tenant and project, if it may read runs."""
        try:
            permit(call.caller, Operation.READ_RUNS)
            return await self.svc.read_in_scope(call.caller, query)
        except errors.RunControlError as exc:
            raise a2a_error(exc) from None

    async def view(self, call: Call, task_id: str) -> dict[str, Any]:
        """The task's run as the read model shows it, or ``TaskNotFound``: an id that is no
        run id, another tenant's or project's run, or a run of another workflow."""
        try:
            run_id = UUID(task_id)
        except ValueError:
            raise TaskNotFoundError(f"task {task_id!r} not found") from None
        project = call.caller.project_scope
        view = await self.read(call, lambda conn: q.get_run(conn, run_id, project_id=project))
        if view is None or view["workflowId"] != call.agent.workflow_id:
            raise TaskNotFoundError(f"task {task_id} not found")
        return view

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return tasks.task_of(await self.view(self.call(context), task_id))

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """A page of the agent's tasks, newest first (``pageToken``: the runs' cursor)."""
        call = self.call(context)
        validate_history_length(params)
        size = params.page_size if params.HasField("page_size") else PAGE_SIZE
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise InvalidParamsError(f"pageSize must be between 1 and {MAX_PAGE_SIZE}")
        wanted = params.status or None  # 0: TASK_STATE_UNSPECIFIED, no filter
        if wanted:
            check_status(wanted)
        run_states = [str(s) for s in _RUN_STATES.get(wanted, ())] if wanted else []
        cursor = params.page_token or None
        if cursor is not None:
            try:
                q.decode_cursor(cursor)
            except (ValueError, TypeError):
                raise InvalidParamsError("pageToken is not one this agent returned") from None
        project, workflow = call.caller.project_scope, call.agent.workflow_id
        after = (
            params.status_timestamp_after.ToDatetime(UTC)
            if params.HasField("status_timestamp_after")
            else None
        )
        run_context = q.RunContext(params.context_id or None, after)

        def page(conn: Connection) -> tuple[list[dict[str, Any]], str | None, int]:
            filters: dict[str, Any] = {
                "project_id": project,
                "states": run_states,
                "workflow_id": workflow,
                "context": run_context,
            }
            items, next_cursor = q.list_runs(conn, cursor=cursor, limit=size, **filters)
            views = [q.get_run(conn, UUID(i["runId"]), project_id=project) for i in items]
            return [v for v in views if v is not None], next_cursor, q.count_runs(conn, **filters)

        views, next_cursor, total = await self.read(call, page)
        found = [
            apply_history_length(tasks.task_of(v, with_artifacts=params.include_artifacts), params)
            for v in views
            if wanted is None or tasks.task_state(v) == wanted
        ]
        # pageSize: how many this page holds (0 for none; the kit and A2A 1.0 §3.1.4).
        return ListTasksResponse(
            tasks=found, next_page_token=next_cursor or "", page_size=len(found), total_size=total
        )

    async def save(self, task: Task, context: ServerCallContext) -> None:
        raise UnsupportedOperationError("a task changes only through its run's commands")

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        raise UnsupportedOperationError("a run is never deleted; cancel its task")
