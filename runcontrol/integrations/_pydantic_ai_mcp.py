"""pydantic-ai's MCP toolsets under an MCP policy (``run_agent(..., mcp=policy)``): each
``MCPToolset`` among an agent's toolsets is wrapped so that its tools' definitions carry the
server's name (the toolset's ``id``, else ``mcp``) and the tool's own name (before a prefix);
``RunControlDurability.wrap_tool_execute`` finds them there and calls the tool with
``mcp_call``, as the policy says (``runcontrol.integrations.mcp.policy_call``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic_ai.exceptions import AgentRunError, UserError
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from ._durable import AgentCalls
from .mcp import McpPolicy, policy_call, transient_mcp_errors

# The keys of a tool definition's metadata naming its MCP server and tool.
SERVER, TOOL = "runcontrol_mcp_server", "runcontrol_mcp_tool"


@dataclass
class McpTagged(WrapperToolset[Any]):
    """An MCP toolset whose tools say which server and tool they are."""

    server: str = "mcp"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        return {
            name: replace(tool, tool_def=self._tagged(name, tool.tool_def))
            for name, tool in tools.items()
        }

    def _tagged(self, name: str, tool_def: ToolDefinition) -> ToolDefinition:
        metadata = {**(tool_def.metadata or {}), SERVER: self.server, TOOL: name}
        return replace(tool_def, metadata=metadata)


def tagged(toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
    """``toolset`` with each MCP toolset in it tagged (``McpTagged``)."""

    def tag(leaf: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(leaf, MCPToolset):
            return McpTagged(leaf, server=leaf.id or "mcp")
        return leaf

    return toolset.visit_and_replace(tag)


async def mcp_call(
    calls: AgentCalls,
    policy: McpPolicy,
    call: ToolCallPart,
    tool_def: ToolDefinition,
    execute: Callable[[], Awaitable[dict[str, Any]]],
) -> Any:
    """An MCP toolset's tool called as ``policy`` says; MCP's failures mapped, pydantic-ai's
    own errors raised as they are (docs/mcp.md). None for a tool of no MCP toolset."""
    metadata = tool_def.metadata or {}
    if SERVER not in metadata:
        return None
    server, tool = str(metadata[SERVER]), str(metadata[TOOL])

    async def mapped() -> dict[str, Any]:
        async with transient_mcp_errors(server, passing=(AgentRunError, UserError)):
            return await execute()

    kind = policy.kind(server, tool)
    arguments = call.args_as_dict()
    return await policy_call(calls, kind, server, tool, call.tool_call_id, arguments, mapped)
