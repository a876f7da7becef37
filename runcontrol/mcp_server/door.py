"""The MCP door on the Serve HTTP app: ``/mcp``, the streamable HTTP transport of the official
``mcp`` SDK (its low-level ``Server`` and ``StreamableHTTPSessionManager``, stateless: any
replica answers any request, nothing is kept between them).

Before the SDK sees a request, the door verifies the bearer token (401 as the API answers
it) and checks the caller may read runs (403); a ``tools/call`` is checked against its
tool's operation too, so a token without the scope is a 403 (``insufficient_scope``) before
anything runs. Each tool is a read or a builder of ``edge.commands`` (``tools``); a refusal
is the tool's error result with the problem the HTTP API would answer (its ``code``,
``status``, ``detail``), never a 5xx; an unknown tool or resource is a JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ResourceUpdated,
    event_to_notification,
)
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ..api.context import Services
from ..api.events import MAX_SEQ, admit_live_stream
from ..api.problems import field_errors, from_error, status_for
from ..api.runs import get_run
from ..domain import PolicyDocument, canonical_hash, errors
from ..domain.access import Operation
from ..edge.auth import Caller, TokenVerifier, permit
from ..edge.commands import Outside
from ..edge.errors import RequestInvalid, Unauthorized
from ..edge.metering import TenantRateLimiter
from ..ports.policy import current_policy
from ..store import catalog
from .tools import DECIDE, TOOLS, WORKFLOW_TOOL, Call, Exposed, Tool, workflow_tool
from .watch import Changes

PATH = "/mcp"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # what the MCP spec lets a tool be named
RUN_URI = "runcontrol://runs/{runId}"
_STATE = "runcontrol_mcp"  # the door's caller in the request's state
_PREFIX = RUN_URI.removesuffix("{runId}")


def may(caller: Caller, operation: Operation) -> bool:
    try:
        permit(caller, operation)
    except errors.RunControlError:
        return False
    return True


async def authenticate(verifier: TokenVerifier, scope: Scope) -> Caller:
    """The bearer token's caller, who must be allowed to read runs (401 / 403 otherwise)."""
    headers = dict(scope["headers"])
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a bearer token is required")
    caller = await verifier.verify_async(token.strip())
    permit(caller, Operation.READ_RUNS)
    return caller


def fixed_schema(name: str) -> dict[str, Any] | None:
    """A fixed tool's input schema, for the SDK's ``Mcp-Param-*`` header check (a workflow's
    tool declares no such header: None, nothing to check)."""
    found = TOOLS.get(name) or (DECIDE if name == DECIDE.name else None)
    return None if found is None else found.input_schema


def operation_of(name: str | None) -> Operation | None:
    """The operation of the tool ``name`` (None: no tool, or not a tool call)."""
    if name is None:
        return None
    if name.startswith(WORKFLOW_TOOL):
        return Operation.SUBMIT_RUN
    found = TOOLS.get(name) or (DECIDE if name == DECIDE.name else None)
    return None if found is None else found.operation


def called_tool(body: bytes) -> str | None:
    """The tool a JSON-RPC ``tools/call`` names, else None (the SDK answers what it is)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("method") != "tools/call":
        return None
    params = doc.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class Found:
    """The door's findings, in the request's state: the caller and its outside sender."""

    caller: Caller
    outside: Outside


class McpServer:
    """The SDK's server over the tools and the runs as resources."""

    def __init__(self, svc: Services, rate_limiter: TenantRateLimiter) -> None:
        self.svc = svc
        self.rate_limiter = rate_limiter
        self.server: Server[Any] = Server(
            "runcontrol",
            version="0.1.0",
            get_tool_input_schema=fixed_schema,
            instructions="Start, watch and steer runcontrol runs: every call is the caller's, "
            "under the same tokens, scopes and approval rules as the HTTP API.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
            on_subscriptions_listen=self.listen,
        )

    # ------------------------------------------------------------------ tools

    async def tools(self, caller: Caller) -> list[Tool]:
        """The tools this caller may call: the fixed ones its roles and scopes allow, the
        decision when its tenant's policy offers it, each workflow that opts in (whose id
        makes a tool name an MCP client takes)."""
        offered = [t for t in TOOLS.values() if may(caller, t.operation)]
        if may(caller, DECIDE.operation) and await self._decisions(caller):
            offered.append(DECIDE)
        if may(caller, Operation.SUBMIT_RUN):
            for workflow_id, release_id, definition in await self.svc.read_in_tenant(
                caller, catalog.agent_releases
            ):
                assert definition.agent is not None
                t = workflow_tool(Exposed(workflow_id, release_id, definition.agent))
                if TOOL_NAME.match(t.name):
                    offered.append(t)
        return offered

    async def tool(self, caller: Caller, name: str) -> Tool | None:
        """The tool ``name`` in the caller's tenant (None: no such tool here)."""
        if name in TOOLS:
            return TOOLS[name]
        if name == DECIDE.name:
            return DECIDE if await self._decisions(caller) else None
        workflow_id = name.removeprefix(WORKFLOW_TOOL)
        if workflow_id == name or not TOOL_NAME.match(name):
            return None
        query = functools.partial(catalog.newest_release, workflow_id=workflow_id)
        found = await self.svc.read_in_tenant(caller, query)
        if found is None or found[1].agent is None:
            return None
        return workflow_tool(Exposed(workflow_id, found[0], found[1].agent))

    async def _decisions(self, caller: Caller) -> bool:
        """Whether the caller's tenant's policy offers the decision tool."""
        policy: PolicyDocument = await self.svc.read_in_tenant(caller, current_policy)
        return policy.mcp_decisions

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        offered = await self.tools(_found(ctx).caller)
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
                for t in offered
            ]
        )

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        found = _found(ctx)
        arguments = params.arguments or {}
        try:
            tool = await self.tool(found.caller, params.name)
        except errors.RunControlError as exc:
            return refused(exc)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"no tool {params.name!r} here")

        async def progress(count: float, message: str) -> None:
            await ctx.session.report_progress(count, None, message)

        call = Call(found.caller, found.outside, self.svc, request_key(ctx, params), progress)
        try:
            permit(found.caller, tool.operation)
            parsed = tool.parse(arguments)
        except ValidationError as exc:
            detail = RequestInvalid(f"the arguments of {tool.name} are invalid")
            return refused(detail, errors=field_errors(exc.errors(include_url=False)))
        except errors.RunControlError as exc:
            return refused(exc)
        try:
            answer = tool.answer(await tool.run(call, parsed))
        except errors.RunControlError as exc:
            return refused(exc)
        text = json.dumps(answer, separators=(",", ":"))
        structured = answer if isinstance(answer, dict) else {"items": answer}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )

    # ------------------------------------------------------------------ resources

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])  # a run is read by its URI

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            uri_template=RUN_URI,
            name="run",
            description="A run as get_run answers it: state, steps, approvals, result.",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def run_resource(self, caller: Caller, uri: str) -> dict[str, Any]:
        """The run ``uri`` names, as ``get_run`` shows it, or a JSON-RPC error: not a run's
        URI, or a run the caller may not see (another tenant's is unknown)."""
        try:
            if not uri.startswith(_PREFIX):
                raise errors.ValidationFailed(f"no resource {uri!r}: runs are {RUN_URI}")
            run_id = TOOLS["get_run"].parse({"runId": uri.removeprefix(_PREFIX)}).run_id
            view: dict[str, Any] = TOOLS["get_run"].answer(await get_run(caller, self.svc, run_id))
        except ValidationError:
            raise MCPError(INVALID_PARAMS, f"no resource {uri!r}: not a run id") from None
        except errors.RunControlError as exc:
            raise MCPError(INVALID_PARAMS, str(exc), problem(exc)) from None
        return view

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        view = await self.run_resource(_found(ctx).caller, uri)
        text = json.dumps(view, separators=(",", ":"))
        contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
        return types.ReadResourceResult(contents=[contents])

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A subscription to runs' changes (``subscriptions/listen``): after the
        acknowledgement, ``notifications/resources/updated`` for each event a subscribed run
        commits, until every one of them ended (or the client went away). Change events of
        the lists (tools, prompts, resources) are not offered."""
        caller = _found(ctx).caller
        uris = list(params.notifications.resource_subscriptions or ())
        views = {uri: await self.run_resource(caller, uri) for uri in uris}
        try:
            admit_live_stream(self.svc, "read_resource")
        except errors.RunControlError as exc:
            raise MCPError(INTERNAL_ERROR, str(exc), problem(exc)) from None
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        honored = types.SubscriptionFilter(resource_subscriptions=uris or None)
        acknowledged = types.SubscriptionsAcknowledgedNotificationParams(
            notifications=honored, _meta=meta
        )
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(params=acknowledged),
            related_request_id=ctx.request_id,
        )

        async def updates(uri: str, view: dict[str, Any]) -> None:
            after = (view["lastEventSeq"], MAX_SEQ)  # from now on; events only
            async for item in Changes(self.svc, caller, UUID(view["runId"]), after):
                if item is not None:
                    notice = event_to_notification(ResourceUpdated(uri), meta)
                    await ctx.session.send_notification(notice, related_request_id=ctx.request_id)

        self.svc.streams.live += 1
        try:
            await asyncio.gather(*(updates(uri, view) for uri, view in views.items()))
        finally:
            self.svc.streams.live -= 1
        return types.SubscriptionsListenResult(_meta=meta)


def _found(ctx: ServerRequestContext[Any]) -> Found:
    assert ctx.request is not None  # streamable HTTP: the request the door checked
    found: Found = ctx.request.scope["state"][_STATE]
    return found


def request_key(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> str:
    """The idempotency key of a call that names none: the caller, the MCP request id and the
    call's arguments (a retry of the same request answers the same run)."""
    found = _found(ctx)
    arguments = canonical_hash({"tool": params.name, "arguments": params.arguments or {}})
    return f"mcp:{found.caller.principal.subject}:{ctx.request_id}:{arguments[:32]}"


def problem(exc: errors.RunControlError, **extra: Any) -> dict[str, Any]:
    """The refusal as the HTTP API's problem would name it."""
    return {
        "code": exc.code,
        "status": status_for(exc),
        "detail": str(exc),
        "retryable": exc.retryable,
        **extra,
    }


def refused(exc: errors.RunControlError, **extra: Any) -> types.CallToolResult:
    body = problem(exc, **extra)
    text = json.dumps(body, separators=(",", ":"), default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=body,
        is_error=True,
    )


class McpDoor:
    """The ASGI app at ``/mcp``: authenticate (and, for a tool call, permit its operation),
    then the SDK's session manager, started on the first request (a mount gets no lifespan
    of its own) and run for the life of the replica's loop."""

    def __init__(
        self, svc: Services, verifier: TokenVerifier, rate_limiter: TenantRateLimiter
    ) -> None:
        self.mcp = McpServer(svc, rate_limiter)
        self.verifier = verifier
        self.manager = StreamableHTTPSessionManager(self.mcp.server, stateless=True)
        self._started: asyncio.Future[None] | None = None
        self._task: asyncio.Future[None] | None = None

    async def _running(self) -> None:
        if self._started is None:
            started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._started = started

            async def run() -> None:
                async with self.manager.run():
                    started.set_result(None)
                    await asyncio.Event().wait()  # until the loop ends

            self._task = asyncio.ensure_future(run())
        await self._started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            caller = await authenticate(self.verifier, scope)
            body, receive = await _buffered(receive)
            operation = operation_of(called_tool(body))
            if operation is not None:
                permit(caller, operation)
        except errors.RunControlError as exc:
            await from_error(exc)(scope, receive, send)
            return
        outside = Outside(caller, self.mcp.svc.db, "mcp", self.mcp.rate_limiter)
        scope.setdefault("state", {})[_STATE] = Found(caller, outside)
        await self._running()
        await self.manager.handle_request(scope, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body (the app's ``BodyLimit`` bounds it), and a ``receive`` that gives
    it again, then what the client sends after it (its disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, again


def mcp_route(svc: Services, verifier: TokenVerifier, rate_limiter: TenantRateLimiter) -> Route:
    """The route ``create_app`` adds: the MCP server at ``/mcp`` (every method: the SDK
    answers those it does not serve)."""
    return Route(PATH, McpDoor(svc, verifier, rate_limiter))
