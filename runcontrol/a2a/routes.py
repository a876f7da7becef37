"""The agent door on the Serve HTTP app: ``/a2a/{workflowId}`` with the card, the JSON-RPC
binding (``/jsonrpc``) and the HTTP+JSON binding (``/rest``), all built by a2a-sdk's route
builders over ``RunTaskHandler``.

Before the SDK sees a request, the door verifies the bearer token (401 as the API answers
it), checks the caller may read runs (403), and finds the workflow as an agent in the
token's tenant: an unknown workflow, another tenant's, or one whose newest release does not
opt in is 404, on every binding and for the card alike.

The host's own card (``/.well-known/agent-card.json`` at the root, where A2A clients and the
conformance kit look first): without a token, the card of the one agent the operator made
public (``RunControl:Api:A2aPublicAgent``), else 401; with a token, its tenant's agent when it
has exactly one (with several, each is at its own path and the root answers 404 naming them).
A card tells what an agent does; every call still needs the token.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api.context import Services
from ..api.problems import from_error
from ..domain import errors, limits
from ..domain.access import Operation
from ..edge.auth import Caller, TokenVerifier, permit
from ..edge.errors import Unauthorized
from ..edge.metering import TenantRateLimiter
from ..store import catalog
from .cards import JSONRPC_PATH, PREFIX, REST_PATH, Agent, agent_card
from .handler import RunTaskHandler
from .store import check_status

# An agent's card: at its root, and under each binding's URL (where a client given an
# interface URL as the agent's base looks for it).
CARD_PATHS = tuple(prefix + AGENT_CARD_WELL_KNOWN_PATH for prefix in ("", JSONRPC_PATH, REST_PATH))
_STATE = "runcontrol_a2a"  # the door's findings in the request's state
_BODY = "runcontrol_a2a_body"  # a POST's body as the SDK read it (ListTasks' raw status)
_VERSION = b"a2a-version"


async def find_agent(svc: Services, caller: Caller, workflow_id: str) -> Agent:
    """The workflow as an agent in the caller's tenant, or ``WorkflowNotFound``."""
    return await _agent_in(svc, caller.tenant_id, workflow_id)


async def _agent_in(svc: Services, tenant_id: str, workflow_id: str) -> Agent:
    limits.name(workflow_id, "workflowId", limit=limits.MAX_WORKFLOW_ID, segment=True)  # else 422
    query = functools.partial(catalog.newest_release, workflow_id=workflow_id)
    found = await svc.read(tenant_id, query, project_id=None)
    if found is None or found[1].agent is None:
        raise errors.WorkflowNotFound(
            f"workflow {workflow_id!r} is no agent here", workflow_id=workflow_id
        )
    release_id, definition = found
    assert definition.agent is not None
    return Agent(tenant_id, workflow_id, release_id, definition.agent)


async def authenticate(verifier: TokenVerifier, request: Request) -> Caller:
    """The bearer token's caller, who must be allowed to read runs (401 / 403 otherwise)."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a bearer token is required")
    caller = await verifier.verify_async(token.strip())
    permit(caller, Operation.READ_RUNS)
    return caller


class AgentDoor:
    """The ASGI app under ``/a2a/{workflowId}``: authenticate, find the agent, then the
    SDK's routes (``inner``)."""

    def __init__(
        self, inner: ASGIApp, svc: Services, verifier: TokenVerifier, public: str | None
    ) -> None:
        self.inner = inner
        self.svc = svc
        self.verifier = verifier
        self.public = public

    def _public_card(self, scope: Scope, request: Request) -> str | None:
        """The public agent's tenant when this is an anonymous GET of its card (at the
        agent's root or under a binding's URL), else None: everything else needs a token."""
        if self.public is None or request.method != "GET" or "authorization" in request.headers:
            return None
        root = scope.get("root_path", "")
        path = scope["path"][len(root) :] if scope["path"].startswith(root) else scope["path"]
        tenant_id, _, workflow_id = self.public.partition("/")
        if path in CARD_PATHS and scope["path_params"]["workflowId"] == workflow_id:
            return tenant_id
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        request = Request(scope)
        workflow_id = scope["path_params"]["workflowId"]
        public_tenant = self._public_card(scope, request)
        caller: Caller | None = None
        try:
            if public_tenant is not None:
                agent = await _agent_in(self.svc, public_tenant, workflow_id)
            else:
                caller = await authenticate(self.verifier, request)
                agent = await find_agent(self.svc, caller, workflow_id)
        except errors.RunControlError as exc:
            await from_error(exc)(scope, receive, send)
            return
        if not any(name == _VERSION for name, _ in scope["headers"]):
            # No A2A-Version: the SDK would take the request for 0.3's and refuse a 1.0 method.
            # A 1.0 method or path is unambiguous, so it is served as 1.0; 0.3's own methods
            # and paths go to the SDK's 0.3 adapter (enable_v0_3_compat) either way.
            scope = {**scope, "headers": [*scope["headers"], (_VERSION, b"1.0")]}
        # Inside the mount the root path is the agent's: /a2a/{workflowId}.
        url = f"{request.url.scheme}://{request.url.netloc}{scope.get('root_path', '')}"
        state = scope.setdefault("state", {})
        state[_STATE] = (caller, agent, url)
        if request.method == "POST":
            chunks: list[bytes] = state.setdefault(_BODY, [])

            async def recording() -> Message:
                message = await receive()
                chunks.append(message.get("body", b""))
                return message

            await self.inner(scope, recording, send)
            return
        await self.inner(scope, receive, send)


def raw_list_status(request: Request) -> object:
    """ListTasks' ``status`` as sent, before a2a-sdk's parse drops an unknown one: the
    HTTP+JSON binding's query parameter, the JSON-RPC binding's param (its body, which the
    SDK has read by then); None for any other request."""
    if request.method == "GET":
        return request.query_params.get("status") if request.url.path.endswith("/tasks") else None
    body = b"".join(request.scope["state"].get(_BODY, ()))
    if b'"ListTasks"' not in body:
        return None
    doc = json.loads(body)  # the SDK parsed it already
    if not isinstance(doc, dict) or doc.get("method") != "ListTasks":
        return None
    params = doc.get("params")
    return params.get("status") if isinstance(params, dict) else None


class CallContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, with the door's caller, agent and the agent's URL."""

    def build(self, request: Request) -> ServerCallContext:
        """Also refuses ListTasks' unknown ``status`` (``InvalidParams``: each binding's
        dispatcher answers an error raised here in its own form)."""
        status = raw_list_status(request)
        if status not in (None, ""):
            check_status(status)
        context = super().build(request)
        caller, agent, url = request.scope["state"][_STATE]
        context.state.update(caller=caller, agent=agent, agent_url=url)
        return context


def _card(grpc_address: str | None) -> Callable[[Request], Awaitable[Response]]:
    async def card(request: Request) -> Response:
        _, agent, url = request.scope["state"][_STATE]
        return JSONResponse(agent_card_to_dict(agent_card(agent, url, grpc_address)))

    return card


def host_card_route(svc: Services, verifier: TokenVerifier, public: str | None) -> Route:
    """``/.well-known/agent-card.json`` at the root: without a token, the card of the agent
    the operator made public (``RunControl:Api:A2aPublicAgent``, ``tenant/workflowId``: the
    demo's under ``runcontrol up --dev``); with one, the token's tenant's one agent."""

    async def host_card(request: Request) -> Response:
        try:
            if public is not None and "authorization" not in request.headers:
                tenant_id, _, workflow_id = public.partition("/")
                agent = await _agent_in(svc, tenant_id, workflow_id)
            else:
                caller = await authenticate(verifier, request)
                ids = await svc.read_in_tenant(caller, catalog.agent_workflows)
                if len(ids) != 1:
                    raise errors.WorkflowNotFound(
                        f"this tenant has {len(ids)} agents: each card is at "
                        "/a2a/{workflowId}/.well-known/agent-card.json"
                        + (f" ({', '.join(ids[:20])})" if ids else "")
                    )
                agent = await find_agent(svc, caller, ids[0])
        except errors.RunControlError as exc:
            return from_error(exc)
        base = f"{request.url.scheme}://{request.url.netloc}"
        url = base + PREFIX.format(workflowId=agent.workflow_id)
        card = agent_card(agent, url, svc.settings.api.a2a_grpc_address)
        return JSONResponse(agent_card_to_dict(card))

    return Route(AGENT_CARD_WELL_KNOWN_PATH, host_card, methods=["GET"])


def agent_mount(
    svc: Services,
    verifier: TokenVerifier,
    rate_limiter: TenantRateLimiter,
    public: str | None = None,
) -> Mount:
    """The mount ``create_app`` adds: every workflow's agent door (``public``: the agent
    whose card answers without a token, ``RunControl:Api:A2aPublicAgent``)."""
    handler = RunTaskHandler(svc, rate_limiter)
    context = CallContextBuilder()
    routes: list[Any] = [
        *(
            Route(path, _card(svc.settings.api.a2a_grpc_address), methods=["GET"])
            for path in CARD_PATHS
        ),
        *create_jsonrpc_routes(
            handler, JSONRPC_PATH, context_builder=context, enable_v0_3_compat=True
        ),
        Mount(
            REST_PATH,
            routes=create_rest_routes(handler, context_builder=context, enable_v0_3_compat=True),
        ),
    ]
    return Mount(PREFIX, app=AgentDoor(Router(routes=routes), svc, verifier, public))
