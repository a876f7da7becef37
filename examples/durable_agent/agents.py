"""The worker app of ``durable-agent``: one step whose function runs a pydantic-ai agent with
``runcontrol.integrations.pydantic_ai.run_agent``.

    runcontrol worker --app examples.durable_agent.agents:worker --tenant demo

The model is scripted (``ScriptedCoder``: offline, and it words its plan differently on every
call) unless ``OPENAI_API_KEY`` is set: then pydantic-ai's OpenAI model
(``DURABLE_AGENT_MODEL``, default ``gpt-4o-mini``). Every model request the scripted model
answers is a line of ``DURABLE_AGENT_REQUEST_LOG`` (default: ``durable-agent-requests.jsonl``
in the temp directory); ``DURABLE_AGENT_PAUSE_S`` makes it pause that long per request, to
kill the worker mid-run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from runcontrol.integrations.pydantic_ai import run_agent
from runcontrol.sdk import Permanent, Step, Worker

WORKFLOW_ID = "durable-agent"
AGENT_ID = "durable-coder"
TASK = "Add a module docstring to one Python file of the repository that has none."
INSTRUCTIONS = (
    "You change a local repository. List its files, read the one you change, then call "
    "propose_change once with the file's whole new content and a one-line summary."
)


def workflow(agent: str = AGENT_ID) -> dict[str, Any]:
    """The workflow definition (``runcontrol release``'s JSON): one approval-gated step that
    writes locally (into the scratch copy)."""
    step = {"name": "change", "agentId": agent, "gate": "approval"}
    return {"workflowId": WORKFLOW_ID, "steps": [{**step, "sideEffectClass": "local-write"}]}


def request_log() -> Path:
    default = Path(tempfile.gettempdir()) / "durable-agent-requests.jsonl"
    return Path(os.environ.get("DURABLE_AGENT_REQUEST_LOG", default))


def requests_of(run_id: str, log: Path | None = None) -> list[dict[str, Any]]:
    """The model requests the scripted model answered for run ``run_id``, in order."""
    path = log or request_log()
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["run"] == run_id]


WORDINGS = ("Add", "Write", "Give", "Put")
REASONS = ("so readers know what it is for", "to describe it", "as its first line")


def _changeable(path: str) -> bool:
    return path.endswith(".py") and not path.endswith("__init__.py") and "test" not in path


class ScriptedCoder:
    """A model offline: list the files, read the first Python file without a docstring,
    propose that file with one (the summary worded at random: no two calls alike), then
    report. Each request it answers is logged with its turn (one more than the responses in
    the conversation)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = 1 + sum(isinstance(m, ModelResponse) for m in messages)
        with request_log().open("a") as log:
            log.write(json.dumps({"run": self.run_id, "turn": turn, "pid": os.getpid()}) + "\n")
        returned = {
            part.tool_name: part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        }
        if "list_files" not in returned:
            return ModelResponse(parts=[ToolCallPart("list_files", {}, tool_call_id="list")])
        if "read_file" not in returned:
            path = next(p for p in returned["list_files"] if _changeable(p))
            call = ToolCallPart("read_file", {"path": path}, tool_call_id="read")
            return ModelResponse(parts=[TextPart(f"Reading {path}."), call])
        if "propose_change" not in returned:
            path = next(
                p.args_as_dict()["path"]
                for m in messages
                if isinstance(m, ModelResponse)
                for p in m.parts
                if isinstance(p, ToolCallPart) and p.tool_name == "read_file"
            )
            summary = f"{random.choice(WORDINGS)} a module docstring to {path} "
            summary += f"{random.choice(REASONS)} (plan {random.randrange(10**6):06d})"
            content = f'"""{Path(path).stem}: {summary}."""\n\n{returned["read_file"]}'
            arguments = {"path": path, "content": content, "summary": summary}
            call = ToolCallPart("propose_change", arguments, tool_call_id="propose")
            return ModelResponse(parts=[TextPart(f"Plan: {summary}."), call])
        return ModelResponse(parts=[TextPart(f"Done: {returned['propose_change']}.")])

    async def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        response = self.respond(messages, info)  # logged as it starts
        await asyncio.sleep(float(os.environ.get("DURABLE_AGENT_PAUSE_S", "0")))
        return response

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for part in (await self.answer(messages, info)).parts:
            if isinstance(part, TextPart):
                for word in part.content.split(" "):  # streamed a word at a time
                    yield word + " "
            elif isinstance(part, ToolCallPart):
                args, call_id = part.args_as_json_str(), part.tool_call_id
                yield {0: DeltaToolCall(part.tool_name, args, tool_call_id=call_id)}

    def model(self) -> FunctionModel:
        return FunctionModel(self.answer, stream_function=self.stream, model_name="scripted")


def model_for(run_id: str) -> Model | str:
    if os.environ.get("OPENAI_API_KEY"):  # a real provider (not tested: no network in tests)
        return f"openai:{os.environ.get('DURABLE_AGENT_MODEL', 'gpt-4o-mini')}"
    return ScriptedCoder(run_id).model()


def _inside(root: Path, path: str) -> Path:
    full = (root / path).resolve()
    if not full.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the repository")
    return full


def coder(repository: Path, scratch: Path, model: Model | str) -> Agent[None, str]:
    """The agent: two reading tools and one that needs approval."""
    agent = Agent(model, name="coder", instructions=INSTRUCTIONS)

    @agent.tool_plain
    def list_files() -> list[str]:
        """The repository's files, relative to its root."""
        return sorted(
            str(p.relative_to(repository))
            for p in repository.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(repository).parts
        )

    @agent.tool_plain
    def read_file(path: str) -> str:
        """The text of one file of the repository."""
        return _inside(repository, path).read_text()

    @agent.tool_plain(requires_approval=True)
    def propose_change(path: str, content: str, summary: str) -> str:
        """Replace the file at ``path`` with ``content`` (its whole new text), once a reviewer
        approved it; ``summary`` says why in a line."""
        if not scratch.exists():
            shutil.copytree(repository, scratch, ignore=shutil.ignore_patterns(".git"))
        _inside(scratch, path).write_text(content)
        return f"{path} changed in {scratch}"

    return agent


async def change(step: Step) -> dict[str, Any]:
    """Run the agent on the task; the change lands in the scratch copy once approved."""
    data = step.input or {}
    repository, scratch = data.get("repository"), data.get("scratch")
    if not isinstance(repository, str) or not isinstance(scratch, str):
        raise Permanent("input needs {repository, scratch}: a local directory and where to copy it")
    agent = coder(Path(repository), Path(scratch), model_for(str(step.run_id)))
    tokens = os.environ.get("DURABLE_AGENT_TOKENS")  # a rate limit of the release, if any
    result = await run_agent(step, agent, TASK, token_limit=tokens)  # text to step.stream
    return {"answer": result.output, "scratch": scratch}


def durable_agent_worker(agent: str = AGENT_ID, **options: Any) -> Worker:
    """The app's worker; ``agent`` renames the agent id (as ``workflow`` does)."""
    options.setdefault("concurrency", 4)
    worker = Worker(WORKFLOW_ID, **options)
    worker.agent(agent)(change)
    return worker


worker = durable_agent_worker()
