"""The HTTP-layer test harness: tokens, an httpx client on the session's Serve instance, and a
tenant's view that publishes workflows and plays the runtime worker (claim, request approval,
report outcome) through ``ray_runtime.client``.

Everything a test asserts goes over real HTTP to a real Ray Serve replica.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
from support import AUDIENCE, ISSUER, SECRET

from runcontrol.api import mint_dev_token
from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome, RequestApproval
from runcontrol.domain import (
    AttemptOutcome,
    PolicyDocument,
    Role,
    SideEffectClass,
    StepSpec,
    WorkflowDefinition,
    canonical_hash,
)

SSE_MAX_STREAMS = 40  # live event streams per replica (api.sse_max_streams)
RSA_KID = "test-key-1"
PROJECT = "proj-1"
REQUESTER = "alice"
REVIEWER = "rita"
SECOND_REVIEWER = "rob"
PROBLEM = "application/problem+json"
HEARTBEAT_S = 0.5  # the test deployment's SSE heartbeat
# The one tenant the test deployment rate-limits (api.tenant_command_rates): a burst of 3
# commands, then one per 20 s; every other tenant is unlimited (the default).
RATE_LIMITED_TENANT = f"t-limited-{uuid.uuid4().hex[:8]}"
RATE_LIMIT = {"per_second": 0.05, "burst": 3}
# the A2A door's own rate-limited tenant: each test that drains a bucket drains its own
A2A_RATE_TENANT = f"t-a2a-limited-{uuid.uuid4().hex[:8]}"
DOORS_RATE_TENANT = f"t-doors-{uuid.uuid4().hex[:8]}"  # test_two_doors: one rate, two doors


def free_port() -> int:
    """A port to listen on (``actors.ingress.free_port``: never an ephemeral one)."""
    from actors.ingress import free_port as pick

    return pick()


def wait_live(base_url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base_url, timeout=5.0) as http:
        while True:
            try:
                if http.get("/health/live").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the Serve app did not come up"
            time.sleep(0.2)


def deploy_app(
    name: str, database_url: str, settings: dict[str, Any] | None, **options: Any
) -> None:
    """Another ``RunControlApi`` app on the session's Serve instance, at ``/name``; its replica
    stops at once when deleted (``serve.delete(name)``). ``options``: the deployment's."""
    from ray import serve

    from serve_app import RunControlApi

    deployment = RunControlApi.options(
        name=f"RunControlApi-{name}",
        graceful_shutdown_timeout_s=0.5,
        graceful_shutdown_wait_loop_s=0.1,
        **options,
    )
    serve.run(
        deployment.bind(database_url=database_url, settings=settings),
        name=name,
        route_prefix=f"/{name}",
    )


@contextmanager
def extra_app(
    api: Any, name: str, database_url: str, settings: dict[str, Any] | None
) -> Iterator[str]:
    """``deploy_app`` for the block; yields the app's base URL and deletes the app after."""
    from ray import serve

    deploy_app(name, database_url, settings)
    try:
        yield f"{api.base_url}/{name}"
    finally:
        serve.delete(name)


@contextmanager
def app_on(api: Any, runtime: Any, name: str, directory: Path, database_url: str) -> Iterator[str]:
    """``extra_app`` with the test settings of ``runtime`` (``api_settings``) and a JWKS file
    (written in ``directory``) naming the public half of ``api``'s key."""
    from runcontrol.api.auth import jwks_document

    jwks = directory / "jwks.json"
    jwks.write_text(jwks_document({RSA_KID: api.rsa_key.public_key()}))
    with extra_app(api, name, database_url, api_settings(runtime, jwks)) as base:
        yield base


def api_settings(ray_runtime: Any, jwks_file: Path) -> dict[str, Any]:
    settings: dict[str, Any] = ray_runtime.settings.model_dump(mode="json")
    settings["auth"] = {
        "hs256_secret": SECRET,
        "hs256_with_jwks": True,  # tests mint HS256 tokens; test_auth proves the default refuses
        "jwks_file": str(jwks_file),
        "issuer": ISSUER,
        "audience": AUDIENCE,
    }
    settings["api"] = {
        "sse_heartbeat_seconds": HEARTBEAT_S,
        "readiness_timeout_seconds": 5,
        # The session's database holds other tests' unclaimed attempts: the stall check is
        # tested on an app of its own (test_health.py).
        "dispatch_stall_seconds": None,
        "sse_max_streams": SSE_MAX_STREAMS,
        "tenant_command_rates": {
            RATE_LIMITED_TENANT: RATE_LIMIT,
            DOORS_RATE_TENANT: RATE_LIMIT,
            A2A_RATE_TENANT: RATE_LIMIT,
        },
    }
    return settings


def proposal(n: int = 1) -> str:
    return canonical_hash({"proposal": n})


@dataclass
class Api:
    base_url: str
    rsa_key: Any  # the private key whose public half is in the server's JWKS file

    def token(
        self,
        tenant: str,
        subject: str = REQUESTER,
        roles: Iterable[str] = (Role.REQUESTER,),
        scopes: Iterable[str] | None = None,
        *,
        project: str = PROJECT,
        ttl_s: int = 3600,
    ) -> str:
        return mint_dev_token(
            SECRET, tenant, project, subject, roles, scopes, ttl_s, issuer=ISSUER, audience=AUDIENCE
        )

    def rs256_token(self, claims: dict[str, Any], key: Any = None, kid: str = RSA_KID) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, **claims}
        return jwt.encode(body, key or self.rsa_key, algorithm="RS256", headers={"kid": kid})

    def client(self, token: str | None = None, **headers: str) -> httpx.Client:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30.0)

    def async_client(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=60.0)


def assert_problem(
    response: httpx.Response, status: int, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].startswith("https://runcontrol.dev/problems/")
    assert body["title"]
    if code is not None:
        assert body["code"] == code, body
        assert body["type"] == f"https://runcontrol.dev/problems/{code}"
    return body


@dataclass
class Sse:
    """One parsed Server-Sent Event (comment lines are counted, not kept)."""

    id: int
    event: str
    data: dict[str, Any]


@dataclass
class SseRead:
    events: list[Sse] = field(default_factory=list)
    comments: int = 0
    ended: bool = False  # the server closed the stream


class SseReader:
    """Parses a text/event-stream incrementally: ``read`` until the stream ends, ``stop_after``
    more events, or (``stop_on_comment``) the next comment line."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        self._lines = response.iter_lines()
        self.retry_ms: int | None = None

    def read(self, *, stop_after: int | None = None, stop_on_comment: bool = False) -> SseRead:
        out = SseRead()
        fields: dict[str, str] = {}
        for line in self._lines:
            if line.startswith(":"):
                out.comments += 1
                if stop_on_comment:
                    return out
                continue
            if line == "":
                if "data" in fields:
                    data = json.loads(fields["data"])
                    out.events.append(Sse(int(fields["id"]), fields["event"], data))
                    if stop_after is not None and len(out.events) >= stop_after:
                        return out
                fields = {}
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "retry":
                self.retry_ms = int(value)
            else:
                fields[name] = value
        out.ended = True
        return out


class TenantView:
    """One tenant: HTTP as its users, and the worker side through ``ray_runtime.client``."""

    def __init__(self, api: Api, runtime: Any, tenant: str) -> None:
        self.api = api
        self.runtime = runtime
        self.tenant = tenant
        self.agent = f"agent-{uuid.uuid4().hex[:8]}"
        self.workflow = f"wf-{uuid.uuid4().hex[:6]}"
        self._clients: dict[Any, httpx.Client] = {}
        self._gated = False

    # ------------------------------------------------------------------ users

    def token(self, subject: str = REQUESTER, *roles: str, **kw: Any) -> str:
        return self.api.token(self.tenant, subject, roles or (Role.REQUESTER,), **kw)

    def user(
        self, subject: str = REQUESTER, *roles: str, scopes: Iterable[str] | None = None
    ) -> httpx.Client:
        """An HTTP client acting as ``subject`` (closed with the tenant view)."""
        key = (subject, tuple(roles), None if scopes is None else tuple(scopes))
        if key not in self._clients:
            self._clients[key] = self.api.client(self.token(subject, *roles, scopes=scopes))
        return self._clients[key]

    def requester(self) -> httpx.Client:
        return self.user(REQUESTER, Role.REQUESTER)

    def reviewer(self, subject: str = REVIEWER) -> httpx.Client:
        return self.user(subject, Role.REVIEWER)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    # ------------------------------------------------------------------ workflows and runs

    def publish(
        self,
        *,
        gate: str = "none",
        side_effect: SideEffectClass = SideEffectClass.READ,
        workflow_id: str | None = None,
        aliases: Iterable[str] = ("latest",),
    ) -> str:
        definition = WorkflowDefinition(
            workflow_id or self.workflow,
            (StepSpec(name="only", agent_id=self.agent, gate=gate, side_effect_class=side_effect),),
        )
        release = self.runtime.container.releases.publish(
            self.tenant, definition, "publisher", datetime.now(UTC), aliases
        )
        return str(release.release_id)

    def publish_policy(self, **fields: Any) -> None:
        self.runtime.container.policies.publish(
            self.tenant, PolicyDocument("default", "ignored", **fields), datetime.now(UTC)
        )

    def body(self, **overrides: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "workflowId": self.workflow,
            "releaseAlias": "latest",
            "modelProfileId": "code-agent",
            "input": {"repository": "ConnectSoft.CaseManagement", "revision": "a1b2c3d"},
            "limits": {"maxCostUsd": 12, "maxMinutes": 45},
        }
        body.update(overrides)
        return body

    def submit(self, client: httpx.Client | None = None, key: str | None = None) -> str:
        http = client or self.requester()
        response = http.post(
            "/factory/runs",
            json=self.body(),
            headers={"Idempotency-Key": key or f"key-{uuid.uuid4().hex}"},
        )
        assert response.status_code == 202, response.text
        return str(response.json()["runId"])

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.requester().get(f"/factory/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's committed events (up to 500), as the requester reads them."""
        response = self.requester().get(f"/factory/runs/{run_id}/events/history?limit=500")
        assert response.status_code == 200, response.text
        events: list[dict[str, Any]] = response.json()
        return events

    def wait_state(self, run_id: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.run(run_id)
            if view["state"] in states:
                return view
            assert time.monotonic() < deadline, f"run stayed {view['state']}, not {states}"
            time.sleep(0.1)

    # ------------------------------------------------------------------ the worker

    def _call(self, coro: Any) -> Any:
        return asyncio.run(coro)

    def claim(self, run_id: str, timeout_s: float = 15.0) -> Claim:
        holder = f"worker-{self.tenant}"
        claim = self._call(self.runtime.client.claim([self.agent], holder, timeout_s))
        assert claim is not None, f"no attempt of run {run_id} became claimable"
        assert str(claim.run_id) == run_id, "claimed another run of this test's agent"
        return claim

    def request_approval(self, claim: Claim, n: int = 1) -> Any:
        return self._call(
            self.runtime.client.send(RequestApproval(**claim.fenced(), proposal_hash=proposal(n)))
        )

    def succeed(self, claim: Claim) -> Any:
        return self._call(
            self.runtime.client.send(
                ReportOutcome(
                    **claim.fenced(),
                    outcome=AttemptOutcome.SUCCEEDED,
                    outcome_hash=canonical_hash({"done": 1}),
                )
            )
        )

    def waiting_for_approval(self, n: int = 1) -> tuple[str, Claim, dict[str, Any]]:
        """A run of this tenant parked on a Pending approval: (runId, claim, approval JSON)."""
        if not self._gated:
            self.publish(gate="approval")
            self._gated = True
        run_id = self.submit()
        claim = self.claim(run_id)
        approval = self.request_approval(claim, n)
        assert approval is not None
        view = self.wait_state(run_id, "WaitingForApproval")
        (pending,) = view["pendingApprovals"]
        assert pending["approvalId"] == str(approval.approval_id)
        return run_id, claim, pending


def decision(
    approval: dict[str, Any], verdict: str = "approve", **overrides: Any
) -> dict[str, Any]:
    body = {
        "decision": verdict,
        "version": approval["version"],
        "proposalHash": approval["proposalHash"],
        "reason": "looks right",
    }
    body.update(overrides)
    return body


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


def new_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"
