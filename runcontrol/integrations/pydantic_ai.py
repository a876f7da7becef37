"""Run a ``pydantic_ai.Agent`` inside a step, durably (``pip install runcontrol[agents]``).

    from runcontrol.integrations.pydantic_ai import run_agent

    @worker.agent("coder")
    async def code(step: Step) -> dict[str, Any]:
        result = await run_agent(step, agent, step.input["task"], side_effects={"push"})
        return {"answer": result.output}

``run_agent`` adds one capability to the run (``RunControlDurability``), built the way
``pydantic_ai.durable_exec`` makes an agent durable on Temporal or DBOS, on Run Control's
primitives instead:

- every model request is a journaled call (``step.run``): its response is stored with the run,
  and a re-entered or retried step gets it back instead of asking the model again. A streamed
  request sends its text to ``step.stream`` as it arrives (the first time only);
- every tool call is a journaled call, named by the model's id of the call;
- a tool that requires approval (``requires_approval=True``, or one raising
  ``ApprovalRequired``) becomes ``step.approval`` of exactly that call (tool name and
  arguments), and runs once approved;
- a tool named in ``side_effects`` (or with ``metadata={"side_effect": True}``) is claimed
  with ``step.tool_call`` before it runs: at most once per run, whatever the retries;
- the tokens of each model request are reported with ``step.consume(token_limit, n)`` when
  ``token_limit`` names the release's rate limit;
- a cancelled run stops before its next model request or tool call;
- with ``mcp`` (a ``runcontrol.integrations.mcp.McpPolicy``), the tools of each ``MCPToolset``
  are called as the policy says (``read``, ``side-effect``, ``approval``: docs/mcp.md).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapToolExecuteHandler
from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
    ToolRetryError,
)
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    RetryFeedbackPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_core import to_jsonable_python

from ..domain import SideEffectClass
from ._durable import AgentCalls, DurableStep

if TYPE_CHECKING:
    from .mcp import McpPolicy

__all__ = ["JournaledModel", "RunControlDurability", "run_agent"]

OutputT = TypeVar("OutputT")
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
# The provider's failures a later try may not meet (the step is retried: Transient).
TRANSIENT: tuple[type[Exception], ...] = (
    ModelRateLimitError,
    ModelUnavailableError,
    ModelServerError,
    ModelConnectionError,
    ModelRequestTimeout,
)
_RETRY: TypeAdapter[RetryFeedbackPart | ToolReturnPart] = TypeAdapter(
    RetryFeedbackPart | ToolReturnPart
)


class JournaledModel(WrapperModel):
    """A model whose every request is a journaled call of the step: sent once per run."""

    def __init__(self, wrapped: Model, calls: AgentCalls) -> None:
        super().__init__(wrapped)
        self.calls = calls

    async def _counted(self, response: ModelResponse) -> Any:
        await self.calls.consumed(response.usage.total_tokens)
        return _RESPONSE.dump_python(response, mode="json")

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        async def send() -> Any:
            wrapped = self.wrapped.request(messages, model_settings, model_request_parameters)
            return await self._counted(await wrapped)

        sent = request_identity(messages)
        return _RESPONSE.validate_python(await self.calls.model_request(send, TRANSIENT, sent))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        async def send() -> Any:
            async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as streamed:
                async for event in streamed:
                    await self.calls.text(_text_of(event))
            return await self._counted(streamed.get())

        sent = request_identity(messages)
        response = _RESPONSE.validate_python(await self.calls.model_request(send, TRANSIENT, sent))
        # The stream was drained inside the journaled call (its text went to step.stream);
        # the run's own consumers see the response's parts as events.
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


# What differs between two runs sending the same request: when and in which run it was made.
_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id", "provider_response_id"})


def request_identity(messages: list[ModelMessage]) -> Any:
    """The messages of a model request as a replay compares them (docs/replay.md): their JSON
    form without the times and ids of the run that sent them."""
    return _stripped(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))


def _stripped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stripped(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stripped(v) for v in value]
    return value


def _text_of(event: AgentStreamEvent) -> str:
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


@dataclass
class RunControlDurability(AbstractCapability[Any]):
    """The capability ``run_agent`` adds to one agent run inside one step."""

    calls: AgentCalls
    side_effects: frozenset[str] = frozenset()
    mcp: McpPolicy | None = None

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built per step, never from a spec

    def get_wrapper_model(self, model: Model) -> Model | None:
        """Whichever model serves a request (a fallback's, one a hook picked) is journaled."""
        return None if isinstance(model, JournaledModel) else JournaledModel(model, self.calls)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        """Under an MCP policy, the MCP toolsets' tools say their server and tool."""
        if self.mcp is None:
            return None
        from ._pydantic_ai_mcp import tagged

        return tagged(toolset)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        if tool_def.kind == "output":  # a function of the (journaled) response: nothing to keep
            return await handler(args)

        async def execute() -> dict[str, Any]:
            try:
                return {"value": to_jsonable_python(await handler(args))}
            except ToolRetryError as retry:  # the model is asked again: the same way on replay
                return {"retry": _RETRY.dump_python(retry.tool_retry, mode="json")}

        side_effect = call.tool_name in self.side_effects or bool(
            (tool_def.metadata or {}).get("side_effect")
        )
        outcome = None
        if self.mcp is not None:  # an MCP toolset's tool is called as the policy says
            from ._pydantic_ai_mcp import mcp_call

            outcome = await mcp_call(self.calls, self.mcp, call, tool_def, execute)
        if outcome is None:
            outcome = await self.calls.tool(
                call.tool_name,
                call.tool_call_id,
                call.args_as_dict(),
                execute,
                side_effect=side_effect,
            )
        if "retry" in outcome:
            raise ToolRetryError(_RETRY.validate_python(outcome["retry"]))
        return outcome["value"]

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Each call waiting for approval is approved (or the attempt parks) by
        ``step.approval`` of exactly that call; calls run elsewhere stay deferred."""
        if not requests.approvals:
            return None
        for call in requests.approvals:
            await self.calls.approve(call.tool_name, call.tool_call_id, call.args_as_dict())
        return DeferredToolResults(
            approvals={call.tool_call_id: True for call in requests.approvals}
        )


async def run_agent(
    step: DurableStep,
    agent: Agent[Any, OutputT],
    prompt: str | None = None,
    *,
    name: str | None = None,
    side_effects: Iterable[str] = (),
    token_limit: str | None = None,
    stream: bool = True,
    action_class: SideEffectClass | None = None,
    mcp: McpPolicy | None = None,
    **run_options: Any,
) -> AgentRunResult[OutputT]:
    """Run ``agent`` on ``prompt`` inside ``step``, durably (the module's docstring).

    - ``name`` prefixes the journaled calls' names (default: the agent's name, else
      ``agent``): two agents run in one step need different names;
    - ``side_effects``: the tools claimed with ``step.tool_call`` (as is a tool with
      ``metadata={"side_effect": True}``);
    - ``token_limit``: the release's rate limit that model tokens count against;
    - ``stream``: send the model's text to ``step.stream``;
    - ``action_class``: the side-effect class approvals are asked for (default: the step's);
    - ``mcp``: the policy of the agent's MCP toolsets' tools (docs/mcp.md);
    - ``run_options`` go to ``agent.run`` (``message_history``, ``deps``, ...)."""
    calls = AgentCalls(
        step,
        name or agent.name or "agent",
        token_limit=token_limit,
        stream_text=stream,
        action_class=action_class,
    )
    durability = RunControlDurability(calls, side_effects=frozenset(side_effects), mcp=mcp)
    capabilities = [durability, *run_options.pop("capabilities", ())]
    if stream and run_options.get("event_stream_handler") is None:
        run_options["event_stream_handler"] = _drained  # a handler makes the run stream
    return await agent.run(prompt, capabilities=capabilities, **run_options)


async def _drained(ctx: RunContext[Any], events: Any) -> None:
    async for _ in events:
        pass
