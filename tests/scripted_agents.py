"""Scripted agents for the adapters' tests (tests/unit/test_integrations_*.py, and
tests/actors/test_integrations_agents.py in the cluster): a coder agent that reads ``app.py``,
proposes a patch worded ``plan #N`` by the model's N-th call (differently on every call) through
a tool that needs approval (``propose``) or a side-effecting one (``push``), then answers
``done``. The same script as a pydantic-ai ``FunctionModel`` and as an ``agents.Model``."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent as OpenAIAgent
from agents import function_tool
from agents.items import ModelResponse as OpenAIResponse
from agents.items import TResponseInputItem, TResponseOutputItem
from agents.items import TResponseStreamEvent as StreamEvent
from agents.models.interface import Model
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import RequestUsage

USAGE = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)


class ScriptedPlanner:
    """The script's state: which tool proposes, the model calls made (``calls``), and, when
    ``log`` is set, a JSON line per call (its turn: one more than the tool results it was
    sent; the process) for a test in another process to count; ``pause_s`` per call;
    ``failures``: the calls that raise (by number) and what."""

    def __init__(self, tool: str = "propose", log: Path | None = None, pause_s: float = 0.0):
        self.tool = tool
        self.calls = 0
        self.log = log
        self.pause_s = pause_s
        self.failures: dict[int, Exception] = {}  # the n-th call raises this

    def made(self, turn: int) -> None:
        self.calls += 1
        if (failure := self.failures.pop(self.calls, None)) is not None:
            raise failure
        if self.log is not None:
            with self.log.open("a") as out:
                out.write(json.dumps({"turn": turn, "pid": os.getpid()}) + "\n")


def turns_made(log: Path) -> list[dict[str, Any]]:
    """The calls a planner logged, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class PydanticPlanner(ScriptedPlanner):
    """``ScriptedPlanner`` as a pydantic-ai ``FunctionModel``."""

    def respond(self, messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        returned = [
            part
            for message in messages
            if isinstance(message, pm.ModelRequest)
            for part in message.parts
            if isinstance(part, pm.ToolReturnPart)
        ]
        self.made(len(returned) + 1)
        usage = RequestUsage(input_tokens=10, output_tokens=5)
        if not returned:
            call = pm.ToolCallPart("read_file", {"path": "app.py"}, tool_call_id="read-1")
            return pm.ModelResponse(parts=[call], usage=usage)
        if len(returned) == 1:
            wording = f"plan #{self.calls}: add a docstring"
            call = pm.ToolCallPart(self.tool, {"patch": wording}, tool_call_id="propose-1")
            return pm.ModelResponse(parts=[pm.TextPart(wording), call], usage=usage)
        return pm.ModelResponse(parts=[pm.TextPart("done")], usage=usage)

    async def stream(
        self, messages: list[pm.ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        response = self.respond(messages, info)
        await asyncio.sleep(self.pause_s)
        for part in response.parts:
            if isinstance(part, pm.TextPart):
                yield part.content
            elif isinstance(part, pm.ToolCallPart):
                args = part.args_as_json_str()
                yield {0: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, stream_function=self.stream)


def pydantic_coder(
    planner: PydanticPlanner,
    ran: list[tuple[str, str]],
    push_metadata: dict[str, Any] | None = None,
) -> Agent[None, str]:
    agent = Agent(planner.model(), name="coder")

    @agent.tool_plain
    def read_file(path: str) -> str:
        ran.append(("read_file", path))
        return "print('hello')\n"

    @agent.tool_plain(requires_approval=True)
    def propose(patch: str) -> str:
        ran.append(("propose", patch))
        return "applied"

    @agent.tool_plain(metadata=push_metadata)
    def push(patch: str) -> str:
        ran.append(("push", patch))
        return "pushed"

    return agent


class OpenAIPlanner(ScriptedPlanner, Model):
    """``ScriptedPlanner`` as an ``agents.Model`` (streaming through the SDK's
    ``ScriptedModel``)."""

    def respond(self, input: str | list[TResponseInputItem]) -> list[TResponseOutputItem]:
        items = [] if isinstance(input, str) else input
        returned = [i for i in items if dict(i).get("type") == "function_call_output"]
        self.made(len(returned) + 1)
        if not returned:
            return [function_call("read_file", {"path": "app.py"}, call_id="read-1")]
        if len(returned) == 1:
            wording = f"plan #{self.calls}: add a docstring"
            return [
                assistant_message(wording),
                function_call(self.tool, {"patch": wording}, call_id="propose-1"),
            ]
        return [assistant_message("done", item_id="done")]

    def respond_to(self, request: tuple[Any, ...], options: dict[str, Any]) -> list[Any]:
        """The output for a request, its ``input`` passed by position or by name."""
        return self.respond(options["input"] if "input" in options else request[1])

    async def get_response(self, *request: Any, **options: Any) -> OpenAIResponse:
        output = self.respond_to(request, options)
        await asyncio.sleep(self.pause_s)
        return OpenAIResponse(output=output, usage=USAGE, response_id=None)

    async def stream_response(self, *request: Any, **options: Any) -> AsyncIterator[StreamEvent]:
        one = ScriptedModel([ModelStep(output=self.respond_to(request, options), usage=USAGE)])
        await asyncio.sleep(self.pause_s)
        async for event in one.stream_response(*request, **options):
            yield event


def openai_coder(planner: OpenAIPlanner, ran: list[tuple[str, str]]) -> OpenAIAgent[Any]:
    @function_tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(("read_file", path))
        return "print('hello')\n"

    @function_tool(needs_approval=True)
    def propose(patch: str) -> str:
        """Apply a patch."""
        ran.append(("propose", patch))
        return "applied"

    @function_tool
    def push(patch: str) -> str:
        """Push a patch."""
        ran.append(("push", patch))
        return "pushed"

    return OpenAIAgent(name="coder", model=planner, tools=[read_file, propose, push])
