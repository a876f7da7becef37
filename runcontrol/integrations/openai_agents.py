"""Run an OpenAI Agents SDK ``Agent`` inside a step, durably (``pip install
runcontrol[agents]``).

    from runcontrol.integrations.openai_agents import run_agent

    @worker.agent("coder")
    async def code(step: Step) -> dict[str, Any]:
        result = await run_agent(step, agent, step.input["task"], side_effects={"push"})
        return {"answer": result.final_output}

What ``temporalio``'s and DBOS's OpenAI Agents integrations do on their engines, on Run
Control's primitives:

- the agent's model is wrapped: each ``get_response`` (and each ``stream_response``, whose
  text goes to ``step.stream`` as it arrives) is a journaled call (``step.run``), so a
  re-entered or retried step gets the stored response back instead of asking the model again;
- each function tool's call is a journaled call, named by the model's id of the call; a tool
  named in ``side_effects`` is claimed with ``step.tool_call`` first (at most once per run);
- a tool with ``needs_approval`` interrupts the run: each interruption becomes
  ``step.approval`` of exactly that call (tool name and arguments) and the run resumes with it
  approved;
- the tokens of each response are reported with ``step.consume(token_limit, n)`` when
  ``token_limit`` names the release's rate limit; a cancelled run stops before its next model
  request or tool call.

The agent's model and function tools are journaled, and those of the agents it hands off to
(listed as agents); a model named by string through the run's model provider, and
``RunConfig.model``. A ``Handoff`` object's agent is not (list the agent itself).

With ``mcp`` (a ``runcontrol.integrations.mcp.McpPolicy``), the tools of the agents' MCP
servers are called as the policy says (``read``, ``side-effect``, ``approval``: docs/mcp.md).
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import openai
from agents import Agent, FunctionTool, RunConfig, Runner, RunResult, RunResultStreaming
from agents.exceptions import AgentsException
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider
from agents.tool_context import ToolContext
from openai.types.responses import Response, ResponseCompletedEvent, ResponseTextDeltaEvent
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ..domain import SideEffectClass
from ..sdk import AgentError
from ._durable import AgentCalls, DurableStep

if TYPE_CHECKING:
    from .mcp import McpPolicy

__all__ = ["JournaledModel", "JournaledModelProvider", "run_agent"]

# The provider's failures a later try may not meet (the step is retried: Transient).
TRANSIENT: tuple[type[Exception], ...] = (
    openai.APIConnectionError,
    openai.RateLimitError,
    openai.InternalServerError,
)
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)


class JournaledModel(Model):
    """A model whose every response is a journaled call of the step: asked once per run."""

    def __init__(self, wrapped: Model, calls: AgentCalls) -> None:
        self.wrapped = wrapped
        self.calls = calls

    # The two requests take the interface's parameters as they come: they pass them on whole.
    async def get_response(self, *request: Any, **options: Any) -> ModelResponse:
        async def send() -> Any:
            response = await self.wrapped.get_response(*request, **options)
            await self.calls.consumed(response.usage.total_tokens)
            return _RESPONSE.dump_python(response, mode="json", by_alias=True, exclude_unset=True)

        return _RESPONSE.validate_python(await self.calls.model_request(send, TRANSIENT))

    async def stream_response(
        self, *request: Any, **options: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        async def send() -> Any:
            completed: Response | None = None
            async for event in self.wrapped.stream_response(*request, **options):
                if isinstance(event, ResponseTextDeltaEvent):
                    await self.calls.text(event.delta)
                elif isinstance(event, ResponseCompletedEvent):
                    completed = event.response
            if completed is None:
                raise RuntimeError("the model's stream ended without response.completed")
            await self.calls.consumed(completed.usage.total_tokens if completed.usage else 0)
            return completed.model_dump(mode="json", by_alias=True, exclude_unset=True)

        # Drained inside the journaled call (its text went to step.stream); the runner builds
        # the turn from the completed response, the same the first time and on replay.
        response = Response.model_validate(await self.calls.model_request(send, TRANSIENT))
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


class JournaledModelProvider(ModelProvider):
    """The run's model provider, its models journaled (models named by string)."""

    def __init__(self, wrapped: ModelProvider, calls: AgentCalls) -> None:
        self.wrapped = wrapped
        self.calls = calls

    def get_model(self, model_name: str | None) -> Model:
        return JournaledModel(self.wrapped.get_model(model_name), self.calls)

    async def aclose(self) -> None:
        await self.wrapped.aclose()


def _journaled_tool(tool: FunctionTool, calls: AgentCalls, side_effect: bool) -> FunctionTool:
    journaled = copy.copy(tool)
    invoke = journaled.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        async def call() -> Any:
            return to_jsonable_python(await invoke(ctx, arguments))

        parsed = json.loads(arguments or "{}")
        return await calls.tool(tool.name, ctx.tool_call_id, parsed, call, side_effect=side_effect)

    journaled.on_invoke_tool = on_invoke_tool
    return journaled


def journaled_agent(
    agent: Agent[Any],
    calls: AgentCalls,
    side_effects: frozenset[str],
    copies: dict[int, Agent[Any]] | None = None,
    mcp: McpPolicy | None = None,
) -> Agent[Any]:
    """A copy of ``agent`` whose model (a ``Model`` instance) and function tools are
    journaled, and so are those of the agents it hands off to (given as agents; a
    ``Handoff`` object's agent is its own); under ``mcp``, its MCP servers' tools too."""
    copies = {} if copies is None else copies
    if id(agent) in copies:  # handoffs may go round
        return copies[id(agent)]
    tools = [
        _journaled_tool(tool, calls, tool.name in side_effects)
        if isinstance(tool, FunctionTool)
        else tool
        for tool in agent.tools
    ]
    model = JournaledModel(agent.model, calls) if isinstance(agent.model, Model) else agent.model
    journaled = copies[id(agent)] = agent.clone(model=model, tools=tools)
    if mcp is not None and agent.mcp_servers:
        from ._openai_agents_mcp import journal_mcp_servers

        journal_mcp_servers(journaled, calls, mcp)
    journaled.handoffs = [
        journaled_agent(h, calls, side_effects, copies, mcp) if isinstance(h, Agent) else h
        for h in agent.handoffs
    ]
    return journaled


async def run_agent(
    step: DurableStep,
    agent: Agent[Any],
    input: str | list[TResponseInputItem],
    *,
    name: str | None = None,
    side_effects: Iterable[str] = (),
    token_limit: str | None = None,
    stream: bool = True,
    action_class: SideEffectClass | None = None,
    run_config: RunConfig | None = None,
    mcp: McpPolicy | None = None,
    **run_options: Any,
) -> RunResult | RunResultStreaming:
    """Run ``agent`` on ``input`` inside ``step``, durably (the module's docstring); each
    interruption for approval is asked with ``step.approval`` and the run resumed.

    - ``name`` prefixes the journaled calls' names (default: the agent's name);
    - ``side_effects``: the function tools claimed with ``step.tool_call``;
    - ``token_limit``: the release's rate limit that model tokens count against;
    - ``stream``: run streamed (``Runner.run_streamed``), the model's text to ``step.stream``;
    - ``mcp``: the policy of the agents' MCP servers' tools (docs/mcp.md);
    - ``action_class``: the side-effect class approvals are asked for (default: the step's);
    - ``run_options`` go to ``Runner.run`` (``context``, ``max_turns``, ...)."""
    calls = AgentCalls(
        step,
        name or agent.name,
        token_limit=token_limit,
        stream_text=stream,
        action_class=action_class,
    )
    config = copy.copy(run_config) if run_config is not None else RunConfig()
    config.model_provider = JournaledModelProvider(config.model_provider, calls)
    if isinstance(config.model, Model):
        config.model = JournaledModel(config.model, calls)
    durable = journaled_agent(agent, calls, frozenset(side_effects), mcp=mcp)
    result = await _run(durable, input, stream, config, run_options)
    calls.check_cancelled()  # a streamed run ends quietly when its model request is cancelled
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            arguments = json.loads(item.arguments or "{}")
            await calls.approve(item.name or "", item.call_id or "", arguments)
            state.approve(item)
        result = await _run(durable, state, stream, config, run_options)
        calls.check_cancelled()
    return result


async def _run(
    agent: Agent[Any], input: Any, stream: bool, config: RunConfig, options: dict[str, Any]
) -> RunResult | RunResultStreaming:
    try:
        if not stream:
            return await Runner.run(agent, input, run_config=config, **options)
        streamed = Runner.run_streamed(agent, input, run_config=config, **options)
        async for _ in streamed.stream_events():
            pass
        return streamed
    except AgentsException as error:  # the runner wraps a tool's error: the step reports the cause
        if isinstance(error.__cause__, AgentError):
            raise error.__cause__ from None
        raise
