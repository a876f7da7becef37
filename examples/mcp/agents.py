"""The worker app of ``examples/mcp`` (``runcontrol worker --app examples.mcp.agents:worker``):
a pydantic-ai agent whose tools are the notes MCP server's (``MCPToolset``), run by
``runcontrol.integrations.pydantic_ai.run_agent`` under ``POLICY``. Its scripted model (no
provider needed) looks the note ``welcome`` up (``read``: answered from the journal on
re-entry), then writes it to the run's ``path`` (``approval``: a reviewer approves exactly
``{"server": "notes", "tool": "write", "arguments": ...}``; it runs once), then answers.

The server: ``MCP_NOTES_URL`` (streamable HTTP) when set, else the example's server started over
stdio. ``MCP_EXAMPLE_AGENT`` names the agent (default ``mcp-notes``), ``MCP_EXAMPLE_PAUSE_S``
pauses the model's last request (for a test to stop the worker there)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runcontrol.integrations.mcp import McpPolicy, McpRule
from runcontrol.integrations.pydantic_ai import run_agent
from runcontrol.sdk import Step, Worker

WORKFLOW_ID = "mcp-notes"
AGENT_ID = "mcp-notes"
# lookup and summaries read; record stores a note once; anything else (write) is approved first
POLICY = McpPolicy(
    [McpRule("notes", "lookup", "read"), McpRule("notes", "record", "side-effect")],
    default="approval",
)


def workflow(agent: str = AGENT_ID) -> dict[str, Any]:
    """The workflow definition: one step whose MCP write is approved by a reviewer."""
    step = {"name": "copy", "agentId": agent, "gate": "approval", "sideEffectClass": "local-write"}
    return {"workflowId": WORKFLOW_ID, "steps": [step]}


def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
    """The scripted model: look the note up, write it to the path asked for, answer."""
    returned = [
        part
        for message in messages
        if isinstance(message, pm.ModelRequest)
        for part in message.parts
        if isinstance(part, pm.ToolReturnPart | pm.UserPromptPart)
    ]
    prompt, results = str(returned[0].content), returned[1:]
    if not results:
        return pm.ModelResponse([pm.ToolCallPart("lookup", {"key": "welcome"}, "lookup-1")])
    if len(results) == 1:
        arguments = {"path": prompt, "content": str(results[0].content)}
        return pm.ModelResponse([pm.ToolCallPart("write", arguments, "write-1")])
    time.sleep(float(os.environ.get("MCP_EXAMPLE_PAUSE_S", "0")))
    return pm.ModelResponse([pm.TextPart(f"copied the note to {prompt}")])


def notes_toolset() -> MCPToolset[Any]:
    if url := os.environ.get("MCP_NOTES_URL"):
        return MCPToolset(url, id="notes")
    from fastmcp.client.transports import PythonStdioTransport

    server = os.path.join(os.path.dirname(__file__), "server.py")
    return MCPToolset(
        PythonStdioTransport(server, ["stdio"], python_cmd=sys.executable), id="notes"
    )


worker = Worker("mcp-example", concurrency=1, wait_s=2.0)


@worker.agent(os.environ.get("MCP_EXAMPLE_AGENT", AGENT_ID))
async def copy(step: Step) -> dict[str, Any]:
    agent = Agent(FunctionModel(respond), toolsets=[notes_toolset()], name="notes")
    result = await run_agent(step, agent, step.input["path"], mcp=POLICY, stream=False)
    return {"answer": result.output}
