"""pydantic-ai's MCP toolsets under an MCP policy (``run_agent(..., mcp=policy)``): each
``MCPToolset`` among an agent's toolsets is wrapped so that its tools' definitions carry the
server's name (the toolset's ``id``, else ``mcp``) and the tool's own name (before a prefix);
``RunControlDurability.wrap_tool_execute`` finds them there and calls the tool as the policy
says (``runcontrol.integrations.mcp.policy_call``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic_ai.mcp import MCPToolset
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

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


def mcp_tool(tool_def: ToolDefinition) -> tuple[str, str] | None:
    """The MCP server and tool a tool definition is of, if it is an MCP toolset's."""
    metadata = tool_def.metadata or {}
    if SERVER not in metadata:
        return None
    return str(metadata[SERVER]), str(metadata[TOOL])
