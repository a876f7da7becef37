"""MCP tool calls inside a step, durably (``pip install runcontrol[mcp]``; docs/mcp.md).

    from runcontrol.integrations.mcp import McpPolicy, McpRule, mcp_session

    POLICY = McpPolicy([McpRule("notes", "lookup", "read"), McpRule("notes", "write", "approval")])

    @worker.agent("writer")
    async def write(step: Step) -> dict[str, Any]:
        async with mcp_session(step, "notes", "http://127.0.0.1:8931/mcp", POLICY) as notes:
            found = await notes.call_tool("lookup", {"key": "welcome"})
            await notes.call_tool("write", {"path": "out.txt", "content": "..."})

What the session's calls are, over the official ``mcp`` SDK's ``Client`` (stdio or streamable
HTTP):

- ``call_tool``, ``read_resource``, ``get_prompt`` and ``list_tools`` are journaled calls
  (``step.run``): the first answer is stored with the run and given back on re-entry, retry and
  after a crash, without asking the server again. The connection is not journaled: it is opened
  at the first call that is not in the journal and reopened after a failure;
- each tool is of the kind the policy gives it by server and tool name (the first matching
  rule; unmatched tools are ``approval``, fail closed): ``read`` is journaled only;
  ``side-effect`` is also claimed with ``step.tool_call`` (at most once per run, keyed by the
  step and the journal name); ``approval`` asks ``step.approval({"server", "tool",
  "arguments"})`` first, so the decision binds exactly those arguments (a changed argument is a
  new proposal), then runs as a side effect: once;
- a lost connection or a server's error that a later try may not meet is ``Transient`` (the
  step is retried, the calls before replayed); a refused request (bad arguments, an unknown
  method) is ``Permanent``; a tool's own error result (``isError``) is a result, journaled.

The agent adapters apply the same policy to an agent's MCP servers (``run_agent(...,
mcp=policy)``): pydantic-ai's ``MCPToolset``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal, TypeVar, cast

from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CallToolResult, GetPromptResult, ListToolsResult, ReadResourceResult
from pydantic import BaseModel

from ..domain import canonical_hash
from ..sdk import AgentError, Permanent, Transient
from ._durable import AgentCalls, DurableStep, bounded

__all__ = [
    "McpPolicy",
    "McpRule",
    "McpSession",
    "ToolKind",
    "mcp_proposal",
    "mcp_session",
    "policy_call",
    "transient_mcp_errors",
]

ToolKind = Literal["read", "side-effect", "approval"]
KINDS: tuple[ToolKind, ...] = ("read", "side-effect", "approval")
Model = TypeVar("Model", bound=BaseModel)
T = TypeVar("T")


@dataclass(frozen=True)
class McpRule:
    """Tools of ``server`` whose name matches ``tool`` (shell-style patterns, ``*`` any) are
    of ``kind``."""

    server: str
    tool: str
    kind: ToolKind

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"an MCP tool's kind is one of {KINDS}, not {self.kind!r}")


class McpPolicy:
    """Which MCP tools read, which have a side effect, which a reviewer approves first: the
    first rule matching the server and the tool's name, else ``default`` (``approval``)."""

    def __init__(self, rules: Iterable[McpRule] = (), default: ToolKind = "approval") -> None:
        self.rules = tuple(rules)
        self.default = default

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> McpPolicy:
        """The policy of a definition's ``mcp`` block: ``{"tools": [{"server": "notes",
        "tool": "lookup*", "kind": "read"}, ...], "default": "approval"}``."""
        rules = [
            McpRule(rule.get("server", "*"), rule.get("tool", "*"), rule["kind"])
            for rule in block.get("tools", ())
        ]
        return cls(rules, block.get("default", "approval"))

    def kind(self, server: str, tool: str) -> ToolKind:
        for rule in self.rules:
            if fnmatchcase(server, rule.server) and fnmatchcase(tool, rule.tool):
                return rule.kind
        return self.default


def mcp_proposal(server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """What a reviewer approves for an MCP tool call: the server, the tool and its arguments."""
    return {"server": server, "tool": tool, "arguments": arguments}


# JSON-RPC's codes of a request refused as it was made: asking again gets the same answer.
REFUSED = frozenset({-32700, -32600, -32601, -32602})


@asynccontextmanager
async def transient_mcp_errors(
    server: str, passing: tuple[type[Exception], ...] = ()
) -> AsyncIterator[None]:
    """Inside: an MCP request's failure raised as the step's error kind. A tool's own error is
    not raised by the SDK (it is a result with ``isError``), so what is raised here is the
    connection's or the protocol's: ``Permanent`` for a refused request, else ``Transient``
    (a lost connection, a server's internal error, a timeout). The ``passing`` kinds (an agent
    framework's own errors) are raised as they are."""
    kept: tuple[type[Exception], ...] = (AgentError, *passing)
    try:
        yield
    except kept:
        raise
    except MCPError as exc:
        if exc.code in REFUSED:
            raise Permanent(f"MCP server {server} refused the request: {exc.message}") from exc
        raise Transient(f"MCP server {server} failed ({exc.code}): {exc.message}") from exc
    except Exception as exc:  # transports raise their own (OSError, httpx, anyio, groups)
        raise Transient(f"MCP server {server} is unreachable: {exc!r}") from exc


async def policy_call(
    calls: AgentCalls,
    kind: ToolKind,
    server: str,
    tool: str,
    call_id: str,
    arguments: dict[str, Any],
    call: Callable[[], Awaitable[Any]],
    ready: Callable[[], Awaitable[None]] | None = None,
) -> Any:
    """``call()`` (an MCP tool's call; it returns its JSON form) as its ``kind`` says: journaled;
    and claimed at most once for ``side-effect``; approved first, then claimed, for
    ``approval``. ``ready()`` (the connection opened) comes before a claim: a server out of
    reach leaves no claim behind, only a call that may have reached it does."""
    proposal = mcp_proposal(server, tool, arguments)
    if kind == "approval":
        await calls.approve(tool, call_id, arguments, proposal=proposal)
    side_effect = kind != "read"
    return await calls.tool(
        tool, call_id, arguments, call, side_effect=side_effect, proposal=proposal, ready=ready
    )


Server = StdioServerParameters | str


def _dumped(result: BaseModel) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


class McpSession:
    """One MCP server's calls from one step (``mcp_session`` opens it); the connection is
    opened at the first call not answered by the journal."""

    def __init__(
        self, step: DurableStep, name: str, server: Server, policy: McpPolicy, **client: Any
    ) -> None:
        self.step = step
        self.name = name
        self.server = server
        self.policy = policy
        self.calls = AgentCalls(step, f"mcp:{name}", stream_text=False)
        self._client_options = client
        self._client: Client | None = None
        self._stack = AsyncExitStack()

    async def _connected(self) -> Client:
        if self._client is None:
            client = Client(self.server, **self._client_options)
            self._client = await self._stack.enter_async_context(client)
        return self._client

    async def close(self) -> None:
        self._client = None
        await self._stack.aclose()

    async def _request(self, send: Callable[[Client], Awaitable[BaseModel]]) -> dict[str, Any]:
        """``send`` over the connection (opened if need be), its answer's JSON form."""

        async def sent() -> dict[str, Any]:
            return _dumped(await send(await self._connected()))

        return await self._guarded(sent)

    async def _ready(self) -> None:
        await self._guarded(self._connected)

    async def _guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` with MCP's failures mapped; the connection is dropped on failure, for
        the next call to reopen."""
        try:
            async with transient_mcp_errors(self.name):
                return await work()
        except AgentError:
            try:
                await self.close()
            except Exception:  # the connection was already lost: nothing to close
                pass
            raise

    async def _journaled(
        self, verb: str, model: type[Model], send: Callable[[Client], Awaitable[BaseModel]]
    ) -> Model:
        self.calls.check_cancelled()

        async def once() -> dict[str, Any]:
            return await self._request(send)

        return model.model_validate(await self.step.run(bounded(f"mcp:{self.name}:{verb}"), once))

    async def list_tools(self) -> ListToolsResult:
        return await self._journaled("list_tools", ListToolsResult, lambda c: c.list_tools())

    async def read_resource(self, uri: str) -> ReadResourceResult:
        return await self._journaled(
            f"read_resource:{uri}", ReadResourceResult, lambda c: c.read_resource(uri)
        )

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None
    ) -> GetPromptResult:
        return await self._journaled(
            f"get_prompt:{name}", GetPromptResult, lambda c: c.get_prompt(name, arguments)
        )

    async def call_tool(
        self, tool: str, arguments: dict[str, Any] | None = None, *, call_id: str | None = None
    ) -> CallToolResult:
        """The tool's result as its kind says (the module's docstring). ``call_id`` names the
        call in the journal (default: a hash of the arguments; a repeated call gets its own
        entry per use, in the step's order)."""
        arguments = dict(arguments or {})
        call_id = call_id or hashlib.sha256(canonical_hash(arguments).encode()).hexdigest()[:12]

        async def call() -> dict[str, Any]:
            return await self._request(lambda c: c.call_tool(tool, arguments))

        kind = self.policy.kind(self.name, tool)
        result = await policy_call(
            self.calls, kind, self.name, tool, call_id, arguments, call, self._ready
        )
        return CallToolResult.model_validate(cast(dict[str, Any], result))


@asynccontextmanager
async def mcp_session(
    step: DurableStep,
    name: str,
    server: Server,
    policy: McpPolicy | None = None,
    **client: Any,
) -> AsyncIterator[McpSession]:
    """An MCP session of ``step`` with ``server`` (a streamable-HTTP URL or
    ``StdioServerParameters``), named ``name`` in the policy, the journal and approvals;
    ``client`` goes to ``mcp.Client`` (``read_timeout_seconds``, ...)."""
    session = McpSession(step, name, server, policy or McpPolicy(), **client)
    try:
        yield session
    finally:
        await session.close()
