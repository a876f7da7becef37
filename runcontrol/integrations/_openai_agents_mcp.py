"""The OpenAI Agents SDK's MCP servers under an MCP policy (``run_agent(..., mcp=policy)``):
the journaled copy of an agent with ``mcp_servers`` lists their tools as the SDK does, each
tool's call then made as the policy says (``runcontrol.integrations.mcp.policy_call``), named
by the model's id of the call. The SDK's conversion of a tool's failure into a message for the
model is turned off for them: a lost server is ``Transient`` (the step retried), never an
answer kept in the journal; a tool's own error result stays a result."""

from __future__ import annotations

import copy
import json
from typing import Any

from agents import Agent, FunctionTool
from agents.exceptions import AgentsException, ModelBehaviorError, UserError
from agents.run_context import RunContextWrapper
from agents.tool import Tool, get_function_tool_origin
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from ._durable import AgentCalls
from .mcp import McpPolicy, policy_call, transient_mcp_errors


def _journaled_mcp_tool(tool: FunctionTool, calls: AgentCalls, policy: McpPolicy) -> FunctionTool:
    origin = get_function_tool_origin(tool)
    server = (origin.mcp_server_name if origin is not None else None) or "mcp"
    journaled = copy.copy(tool)
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        async def call() -> Any:
            async with transient_mcp_errors(server, passing=(ModelBehaviorError, UserError)):
                try:
                    return to_jsonable_python(await invoke(ctx, arguments))
                except (ModelBehaviorError, UserError):  # the model's or the code's: as they are
                    raise
                except AgentsException as exc:  # the SDK's wrapping of the MCP call's failure
                    if isinstance(exc.__cause__, Exception):
                        raise exc.__cause__ from exc
                    raise

        parsed = json.loads(arguments or "{}")
        kind = policy.kind(server, tool.name)
        return await policy_call(calls, kind, server, tool.name, ctx.tool_call_id, parsed, call)

    journaled.on_invoke_tool = on_invoke_tool
    return journaled


def journal_mcp_servers(agent: Agent[Any], calls: AgentCalls, policy: McpPolicy) -> None:
    """Make the tools of ``agent``'s (a journaled copy's) MCP servers called under ``policy``."""
    agent.mcp_config = {**agent.mcp_config, "failure_error_function": None}
    listed = agent.get_mcp_tools

    async def get_mcp_tools(run_context: RunContextWrapper[Any]) -> list[Tool]:
        return [
            _journaled_mcp_tool(tool, calls, policy) if isinstance(tool, FunctionTool) else tool
            for tool in await listed(run_context)
        ]

    setattr(agent, "get_mcp_tools", get_mcp_tools)  # noqa: B010 (this copy's own listing)
