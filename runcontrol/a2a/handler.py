"""``RunTaskHandler``: a2a-sdk's ``RequestHandler`` over runs, the third door.

Every A2A method is a run read or an outside command made by its builder in
``runcontrol.edge.commands`` (the builders HTTP and gRPC call): the permission, the
visibility, the idempotency key and the input's checks are theirs, the rule is the grain's,
and a refusal is audited where the grain audits it. Nothing is kept here: a task is read from
its run each time (``RunTaskStore``), a stream reads the run's events from the store after a
cursor, so any replica serves any task, after any restart.

Why not the SDK's ``DefaultRequestHandler``: it runs an ``AgentExecutor`` in this process
and keeps the task live in an in-memory ``ActiveTaskRegistry``, saving what the executor
emits into a ``TaskStore``; its cancel writes CANCELED into the store at once. Here the run's
grain decides every state and workers in other processes execute the steps, so the handler
implements the SDK's ``RequestHandler`` interface itself, and the SDK's dispatchers, route
builders, types and errors do the protocol (docs/a2a.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar
from uuid import UUID

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length

from ..api.context import Services
from ..api.events import admit_live_stream, counted
from ..commands import Command
from ..domain import Decision, Limits, RunState, errors
from ..domain.agent import DataPart, Part, TextPart
from ..edge import commands
from ..edge.commands import Outside
from ..edge.errors import RateLimited
from ..edge.metering import TenantRateLimiter
from ..store.commit import EVENTS_CHANNEL
from . import streams, tasks
from .cards import agent_card
from .push import PushConfigs
from .store import Call, RunTaskStore, a2a_error
from .streams import CURSOR_HEADER, Cursor, Event
from .tasks import Ask

T = TypeVar("T")


# Refusals of admission before a run exists: the answer is a REJECTED task, not stored.
ADMISSION = (RateLimited, errors.CapacityDenied, errors.FlowDenied, errors.BudgetReservationDenied)


class Answered(Exception):
    """A message answered without a run command: ``answer`` is the REJECTED task of a
    submission refused admission, or the agent's reply restating what a task asks."""

    def __init__(self, answer: Task | Message) -> None:
        super().__init__(answer.message_id if isinstance(answer, Message) else answer.id)
        self.answer = answer


class RunTaskHandler(RequestHandler):
    def __init__(self, services: Services, rate_limiter: TenantRateLimiter) -> None:
        self.svc = services
        self.store = RunTaskStore(services, rate_limiter)
        self.push = PushConfigs(services, self.store)

    async def _send(self, build: Any) -> Any:
        """Build an outside command (an awaitable or a command) and send it; a refusal is the
        A2A error (the grain audited it as it audits the same refusal over HTTP)."""
        try:
            command: Command[Any] = await build if asyncio.iscoroutine(build) else build
            return await self.svc.send(command)
        except errors.RunControlError as exc:
            raise a2a_error(exc) from None

    # ------------------------------------------------------------------ reads

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        validate_history_length(params)
        task = await self.store.get(params.id, context)
        assert task is not None  # the store raises TaskNotFound
        return apply_history_length(task, params)

    @validate_request_params
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await self.store.list(params, context)

    # ------------------------------------------------------------------ commands

    @validate_request_params
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        call = self.store.call(context)
        try:
            view, answered = await self._message(call, params)
        except Answered as done:
            return done.answer
        if params.configuration.return_immediately or tasks.task_of(view).status.state in (
            tasks.TERMINAL
        ):
            return tasks.task_of(view)
        return tasks.task_of(await self._settled(call, view, answered))

    async def _message(
        self, call: Call, params: SendMessageRequest
    ) -> tuple[dict[str, Any], str | None]:
        """A new task (the message submits a run) or the answer to what a task asks; the
        run's view after it, and the key of the ask answered (None for a submission)."""
        message = params.message
        if not message.message_id:
            raise InvalidParamsError("message.messageId is required (the idempotency key)")
        if message.task_id:
            view, answered = await self._answer(call, message)
        else:
            view, answered = await self._submit(call, message), None
        if params.configuration.HasField("task_push_notification_config"):
            push = params.configuration.task_push_notification_config
            await self.push.set(call, view, push)
        return view, answered

    async def _submit(self, call: Call, message: Message) -> dict[str, Any]:
        agent = call.agent
        try:
            run_input = agent.exposure.run_input(_parts(message))
            command = commands.submit_run(
                call.outside,
                message.message_id,
                correlation_id=message.context_id or None,
                limits=Limits(),
                workflow_id=agent.workflow_id,
                release_id=agent.release_id,
                model_profile_id=agent.exposure.model_profile_id,
                input=run_input,
            )
            result = await self.svc.send(command)
        except ADMISSION as exc:
            raise Answered(tasks.rejected(message, exc)) from None
        except errors.RunControlError as exc:
            raise a2a_error(exc) from None
        return await self.store.view(call, str(result.run_id))

    async def _answer(self, call: Call, message: Message) -> tuple[dict[str, Any], str]:
        view = await self.store.view(call, message.task_id)
        if message.context_id and message.context_id != tasks.context_id(view):
            raise InvalidParamsError(
                f"context {message.context_id} is not task {message.task_id}'s context"
            )
        ask = tasks.ask_of(view)
        if RunState(view["state"]).terminal:
            raise UnsupportedOperationError(f"task {message.task_id} has ended")
        if ask is None:
            raise UnsupportedOperationError(f"task {message.task_id} asks for no input now")
        run_id = UUID(view["runId"])
        if ask.kind == "signal":
            body = _signal_body(_parts(message))
            assert ask.name is not None
            await self._send(
                commands.send_signal(
                    call.outside, message.message_id, run_id=run_id, name=ask.name, body=body
                )
            )
        elif not any(kind == "data" for kind, _ in tasks.part_values(message.parts)):
            # Free text is conversation, not a decision (one is bound to a proposal hash):
            # the agent restates the ask and the task is unchanged.
            raise Answered(tasks.restated(view, ask, message))
        else:
            await self._send(_decision(call.outside, message, ask))
        return await self.store.view(call, message.task_id), ask.key

    async def _settled(
        self, call: Call, view: dict[str, Any], answered: str | None
    ) -> dict[str, Any]:
        """The run once its task is terminal or asks for something new (not ``answered``),
        or as it is after ``api.prefer_wait_max_seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.svc.settings.api.prefer_wait_max_seconds
        key = (str(view["runId"]),)
        self.svc.feed.start()
        while True:
            since = self.svc.feed.generation(EVENTS_CHANNEL, key)
            view = await self.store.view(call, str(view["runId"]))
            if _stops(view, answered):
                return view
            left = deadline - loop.time()
            if left <= 0:
                return view
            await self.svc.feed.wait(EVENTS_CHANNEL, key, since, left)

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        call = self.store.call(context)
        view = await self.store.view(call, params.id)
        if RunState(view["state"]).terminal:
            raise TaskNotCancelableError(f"task {params.id} has ended ({view['state']})")
        try:
            command = await commands.cancel_run(
                call.outside, None, run_id=UUID(view["runId"]), reason="A2A CancelTask"
            )
            await self.svc.send(command)
        except errors.Conflict as exc:
            raise TaskNotCancelableError(str(exc), {"code": exc.code}) from None
        except errors.RunControlError as exc:
            raise a2a_error(exc) from None
        # Cancelling shows as WORKING: CANCELED only once every attempt settled.
        return tasks.task_of(await self.store.view(call, params.id))

    # ------------------------------------------------------------------ streams

    @validate_request_params
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        call = self.store.call(context)
        cursor = _cursor(context)
        self._admit_stream()
        try:
            view, answered = await self._message(call, params)
        except Answered as done:
            yield done.answer
            return
        follow = self._follow(call, view, cursor, answered, until_asked=True)
        async for event in counted(self.svc.streams, follow):
            yield event

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        call = self.store.call(context)
        view = await self.store.view(call, params.id)
        if RunState(view["state"]).terminal and _cursor(context) is None:
            raise UnsupportedOperationError(f"task {params.id} has ended ({view['state']})")
        self._admit_stream()
        follow = self._follow(call, view, _cursor(context), None, until_asked=False)
        async for event in counted(self.svc.streams, follow):
            yield event

    def _admit_stream(self) -> None:
        """A stream is one of the replica's live streams, as an SSE one is
        (``api.sse_max_streams``): past them, a retryable error before anything is done."""
        try:
            admit_live_stream(self.svc, "GetTask")
        except errors.RunControlError as exc:
            raise a2a_error(exc) from None

    def _follow(
        self,
        call: Call,
        view: dict[str, Any],
        cursor: Cursor | None,
        answered: str | None,
        *,
        until_asked: bool,
    ) -> AsyncIterator[Event]:
        """The task now, then its run's events and output after ``cursor`` (``streams``),
        until the task ends (``until_asked``: or asks for something new)."""
        self.svc.feed.start()
        return streams.stream(
            self.svc.feed,
            lambda query: self.store.read(call, query),
            view,
            call.caller.project_scope,
            cursor,
            lambda now: _stops(now, answered if until_asked else "*"),
        )

    # ------------------------------------------------------------------ the card

    @validate_request_params
    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        call = self.store.call(context)
        return agent_card(call.agent, context.state["agent_url"], extended=True)

    # ------------------------------------------------------------------ push notifications

    @validate_request_params
    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        call = self.store.call(context)
        return await self.push.set(call, await self.store.view(call, params.task_id), params)

    @validate_request_params
    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self.push.get(self.store.call(context), params.task_id, params.id)

    @validate_request_params
    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        return await self.push.list_configs(self.store.call(context), params.task_id)

    @validate_request_params
    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self.push.delete(self.store.call(context), params.task_id, params.id)


def _stops(view: dict[str, Any], answered: str | None) -> bool:
    """Whether a wait for the task ends at ``view``: terminal, or asking for something other
    than ``answered`` ("*": only terminal ends it)."""
    state = tasks.task_state(view)
    if state in tasks.TERMINAL:
        return True
    if answered == "*" or state not in tasks.INTERRUPTED:
        return False
    ask = tasks.ask_of(view)
    return ask is not None and ask.key != answered


def _cursor(context: ServerCallContext) -> Cursor | None:
    """Where a stream resumes: after the cursor in ``Last-Event-ID`` (a service parameter of
    the SDK's client), else from now (the output from its start)."""
    raw = (context.state.get("headers") or {}).get(CURSOR_HEADER)
    return None if raw is None else Cursor.parse(raw)


def _parts(message: Message) -> list[Part]:
    parts: list[Part] = []
    for i, (kind, value) in enumerate(tasks.part_values(message.parts)):
        if kind == "text":
            parts.append(TextPart(value))
        elif kind == "data":
            parts.append(DataPart(value))
        else:
            raise InvalidParamsError(f"parts[{i}]: this agent takes text and data parts only")
    return parts


def _signal_body(parts: list[Part]) -> Any:
    """A signal's body: the one data part's value, else the text parts joined."""
    data = [p.data for p in parts if isinstance(p, DataPart)]
    if len(data) > 1:
        raise InvalidParamsError("a signal takes one data part (or text)")
    if data:
        return data[0]
    return "\n".join(p.text for p in parts if isinstance(p, TextPart))


def _decision(o: Outside, message: Message, ask: Ask) -> Any:
    """The approval decision a reply carries (a data part: ``decision`` and the
    ``proposalHash`` decided on; ``version`` and ``approvalId`` default to the pending
    request's), built by the decision's builder: who may decide is the domain's rule."""
    assert ask.approval is not None
    found = [p.data for p in _parts(message) if isinstance(p, DataPart)]
    if len(found) != 1 or not isinstance(found[0], dict):
        raise InvalidParamsError(
            'an approval takes one data part {"decision": ..., "proposalHash": ...}'
        )
    data = found[0]
    try:
        decision = Decision(str(data.get("decision")))
    except ValueError:
        raise InvalidParamsError(f"decision must be one of {[str(d) for d in Decision]}") from None
    proposal_hash = data.get("proposalHash")
    version = data.get("version", ask.approval["version"])
    reason = data.get("reason")
    if isinstance(version, float) and version.is_integer():
        version = int(version)  # a JSON number read back from the ask (a Struct's double)
    if not isinstance(proposal_hash, str) or not proposal_hash:
        raise InvalidParamsError("proposalHash is required: a decision is bound to it")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**63:
        raise InvalidParamsError("version must be a positive integer")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 2000):
        raise InvalidParamsError("reason must be text of at most 2000 characters")
    try:
        approval_id = UUID(str(data.get("approvalId", ask.approval["approvalId"])))
    except ValueError:
        raise InvalidParamsError("approvalId must be a UUID") from None
    return commands.decide_approval(
        o,
        message.message_id,
        approval_id=approval_id,
        decision=decision,
        version=version,
        proposal_hash=proposal_hash,
        reason=reason,
    )
