"""``runcontrol.integrations.mcp`` on a step kept in memory (durable_step.py) against the
example's real MCP server (tests/mcp_servers.py: a process, over stdio and over streamable
HTTP, counting its tool bodies' runs in a file): journaled calls answered from the journal on
re-entry, a side effect at most once, an approval of exactly the server, tool and arguments,
a tool's error result journaled, a lost server ``Transient``; and a pydantic-ai agent's
``MCPToolset`` under the same policy through ``run_agent``. The cluster, a worker killed after
an approved call: tests/actors/test_example_mcp.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from durable_step import MemoryStep
from mcp_servers import free_port, http_server, runs, stdio_server
from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runcontrol.domain import canonical_hash
from runcontrol.integrations.mcp import McpPolicy, McpRule, McpSession, mcp_session
from runcontrol.integrations.pydantic_ai import run_agent
from runcontrol.sdk import Transient
from runcontrol.sdk._step import Parked

POLICY = McpPolicy(
    [
        McpRule("notes", "lookup", "read"),
        McpRule("notes", "refuse", "read"),
        McpRule("notes", "record", "side-effect"),
    ]
)  # write: unmatched, so approval
WRITE = {"path": "", "content": "approved text"}


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    counter = tmp_path / "runs.jsonl"
    if request.param == "stdio":
        yield stdio_server(counter)
    else:
        with http_server(counter) as url:
            yield url


@pytest.fixture
def http(tmp_path: Path) -> Iterator[str]:
    with http_server(counter_of(tmp_path)) as url:
        yield url


def counter_of(tmp_path: Path) -> Path:
    return tmp_path / "runs.jsonl"


def session_run(step: MemoryStep, server: Any, body: Callable[[McpSession], Any]) -> Any:
    async def main() -> Any:
        async with mcp_session(step, "notes", server, POLICY) as notes:
            return await body(notes)

    return asyncio.run(main())


def test_reads_are_answered_from_the_journal_on_reentry(server: Any, tmp_path: Path) -> None:
    step = MemoryStep()

    async def body(notes: McpSession) -> list[Any]:
        tools = await notes.list_tools()
        found = await notes.call_tool("lookup", {"key": "welcome"})
        refused = await notes.call_tool("refuse", {"reason": "no"})
        resource = await notes.read_resource("notes://welcome")
        prompt = await notes.get_prompt("summarize", {"key": "welcome"})
        return [
            sorted(t.name for t in tools.tools),
            found.structured_content,
            (refused.is_error, "refused: no" in str(refused.content)),
            resource.contents[0].model_dump().get("text"),
            len(prompt.messages),
        ]

    first = session_run(step, server, body)
    assert first == [
        ["lookup", "record", "refuse", "write"],
        {"result": "hello from the notes server"},
        (True, True),  # a tool's own error is a result, journaled
        "hello from the notes server",
        1,
    ]
    step.reenter()
    assert session_run(step, server, body) == first
    assert runs(counter_of(tmp_path)) == {"lookup": 1, "refuse": 1}  # not asked again


def test_a_side_effect_runs_at_most_once_and_an_approval_binds_its_arguments(
    server: Any, tmp_path: Path
) -> None:
    step = MemoryStep()
    target = tmp_path / "out.txt"
    arguments = dict(WRITE, path=str(target))

    async def body(notes: McpSession) -> Any:
        await notes.call_tool("record", {"key": "k", "text": "t"})
        return await notes.call_tool("write", arguments)

    with pytest.raises(Parked):
        session_run(step, server, body)
    proposal = {"server": "notes", "tool": "write", "arguments": arguments}
    assert step.asked == [proposal]
    assert runs(counter_of(tmp_path)) == {"record": 1}
    # Approved: the write runs once, the record is not made again; a second re-entry
    # (a retry) replays both.
    for _ in range(2):
        step.reenter(canonical_hash(proposal))
        written = session_run(step, server, body)
        assert not written.is_error
    assert target.read_text() == "approved text"
    assert runs(counter_of(tmp_path)) == {"record": 1, "write": 1}
    # A changed argument is a new proposal: asked, not run.
    step.reenter(canonical_hash(proposal))
    arguments["content"] = "other text"
    with pytest.raises(Parked):
        session_run(step, server, lambda notes: notes.call_tool("write", arguments))
    assert step.asked[-1]["arguments"]["content"] == "other text"
    assert runs(counter_of(tmp_path))["write"] == 1


def test_a_lost_server_is_transient_and_the_retried_step_replays_the_calls_before(
    tmp_path: Path,
) -> None:
    step = MemoryStep()

    async def body(notes: McpSession) -> Any:
        await notes.call_tool("lookup", {"key": "welcome"})
        await notes.call_tool("record", {"key": "k", "text": "t"})
        return await notes.call_tool("lookup", {"key": "k"})

    with http_server(counter_of(tmp_path)) as url:
        session_run(step, url, lambda notes: notes.call_tool("lookup", {"key": "welcome"}))
    # The server is gone (its process ended) before the step's second call.
    step.reenter()
    with pytest.raises(Transient, match="notes"):
        session_run(step, url, body)
    step.reenter()  # retried: the connection is opened again, to the server back up
    with http_server(counter_of(tmp_path)) as url:
        found = session_run(step, url, body)
    assert found.structured_content == {"result": "t"}
    assert runs(counter_of(tmp_path)) == {"lookup": 2, "record": 1}  # welcome once, k once


def test_a_policy_takes_the_first_matching_rule_and_fails_closed() -> None:
    policy = McpPolicy.from_block(
        {
            "tools": [
                {"server": "notes", "tool": "lookup*", "kind": "read"},
                {"tool": "delete_*", "kind": "approval"},
                {"server": "notes", "kind": "side-effect"},
            ]
        }
    )
    assert policy.kind("notes", "lookup_all") == "read"
    assert policy.kind("files", "delete_all") == "approval"
    assert policy.kind("notes", "record") == "side-effect"
    assert policy.kind("files", "read") == "approval"  # no rule: the default
    with pytest.raises(ValueError, match="kind"):
        McpRule("notes", "*", "write")  # type: ignore[arg-type]


def test_a_server_out_of_reach_is_transient_and_not_journaled() -> None:
    step = MemoryStep()
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(Transient, match="notes"):
        session_run(step, url, lambda notes: notes.call_tool("lookup", {"key": "welcome"}))
    assert step.journal == {}  # the next execution asks again


def copy_note(path: str, results: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The scripted model's next call, by the results it was sent: look the note up, write it
    to ``path`` (the approval tool), then none (it answers ``done``)."""
    if not results:
        return "lookup", {"key": "welcome"}
    if len(results) == 1:
        return "write", {"path": path, "content": results[0]}
    return None


def pydantic_runner(url: str, path: str) -> Callable[[MemoryStep], str]:
    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        results = [
            str(part.content)
            for message in messages
            if isinstance(message, pm.ModelRequest)
            for part in message.parts
            if isinstance(part, pm.ToolReturnPart)
        ]
        if (call := copy_note(path, results)) is None:
            return pm.ModelResponse([pm.TextPart("done")])
        return pm.ModelResponse([pm.ToolCallPart(*call, tool_call_id=f"c{len(results)}")])

    agent = Agent(FunctionModel(respond), toolsets=[MCPToolset(url, id="notes")])

    def run(step: MemoryStep) -> str:
        return asyncio.run(run_agent(step, agent, "copy", mcp=POLICY, stream=False)).output

    return run


def openai_runner(url: str, path: str) -> Callable[[MemoryStep], str]:
    from agents import Agent as OpenAIAgent
    from agents import RunConfig
    from agents.mcp import MCPServerStreamableHttp
    from agents.testing import assistant_message, function_call
    from scripted_agents import OpenAIPlanner

    from runcontrol.integrations import openai_agents

    class Planner(OpenAIPlanner):
        def respond(self, input: Any) -> list[Any]:
            items = [dict(i) for i in ([] if isinstance(input, str) else input)]
            results = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
            if (call := copy_note(path, results)) is None:
                return [assistant_message("done")]
            return [function_call(*call, call_id=f"c{len(results)}")]

    def run(step: MemoryStep) -> str:
        async def main() -> str:
            async with MCPServerStreamableHttp({"url": url}, name="notes") as notes:
                agent = OpenAIAgent(name="notes", model=Planner(), mcp_servers=[notes])
                config = RunConfig(tracing_disabled=True)
                result = await openai_agents.run_agent(
                    step, agent, "copy", mcp=POLICY, stream=False, run_config=config
                )
                return str(result.final_output)

        return asyncio.run(main())

    return run


@pytest.mark.parametrize("runner", [pydantic_runner, openai_runner], ids=["pydantic-ai", "openai"])
def test_an_agents_mcp_server_is_under_the_policy(
    http: str, tmp_path: Path, runner: Callable[..., Callable[[MemoryStep], str]]
) -> None:
    """Each framework's own MCP server type (over HTTP: stdio is the same to the adapters)."""
    target = tmp_path / "out.txt"
    run = runner(http, str(target))
    step = MemoryStep()
    with pytest.raises(Parked):
        run(step)
    proposal = step.asked[-1]
    assert proposal["server"] == "notes" and proposal["tool"] == "write"
    assert proposal["arguments"]["path"] == str(target)
    for _ in range(2):  # approved, then a retry of the step: the calls replayed
        step.reenter(canonical_hash(proposal))
        assert run(step) == "done"
    assert "hello from the notes server" in target.read_text()
    assert runs(counter_of(tmp_path)) == {"lookup": 1, "write": 1}
