"""Two tenants, two projects, every operation fuzzed: no response names another scope's run,
approval, event, step, attempt or lease (issue 13, item 7).

Three scopes are seeded over HTTP and the worker client: tenant A / project P1, tenant A /
project P2, tenant B / project P1. Each holds a run waiting for approval (its Pending
approval), a completed run and a cancelled one, with their events. Their ids are gathered from
the API's own answers (run views, event histories, approval lists).

Then, as a caller bound to one scope (a project-scoped caller of A/P1; an operator of A, who
may see both of A's projects; an operator of B), every operation of the OpenAPI document is
sent cases Hypothesis generates from it (schemathesis strategies), with each path id drawn
either as generated or from the ids of every scope. Every stream (an answer of type
text/event-stream) is read up to its first heartbeat: everything it replays, bounded. Each answer's
body and headers must name no id of another scope that the request did not itself carry (an
error may echo the id it was asked about), and a request naming another scope's id must not
succeed.

``RUNCONTROL_FUZZ_EXAMPLES`` sets the cases per operation and caller (default 6: about 350
requests); the count and the leaks are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from api_harness import Api, TenantView, new_tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schemathesis import DOCUMENT

from runcontrol.domain import Role

EXAMPLES = int(os.environ.get("RUNCONTROL_FUZZ_EXAMPLES", "6"))
P1, P2 = "proj-1", "proj-2"
ID_KEYS = frozenset({"runId", "approvalId", "eventId", "stepId", "attemptId", "leaseId"})
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MAX_STREAM_LINES = 5000
# A stream is read for at most this long, whatever it sends: its heartbeats reset httpx's read
# timeout, so an unbounded read of one never ends (a stream the test did not know as one, the
# output stream of a waiting run, once held CI until its 90 minutes ran out).
MAX_STREAM_S = 20.0

OPERATIONS = [
    result.ok() for result in schemathesis.openapi.from_dict(DOCUMENT).get_all_operations()
]


@dataclass
class Scope:
    name: str
    view: TenantView
    project: str
    runs: list[str] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def http(self, *roles: str) -> httpx.Client:
        return self.view.api.client(
            self.view.token(f"seed-{self.name}", *roles, project=self.project)
        )


def _collect(value: Any, into: set[str]) -> None:
    """Every id of the kinds in ``ID_KEYS`` anywhere in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ID_KEYS and isinstance(item, str) and UUID_RE.match(item):
                into.add(item)
            _collect(item, into)
    elif isinstance(value, list):
        for item in value:
            _collect(item, into)


def _seed(scope: Scope) -> None:
    """A run waiting for approval, a completed run and a cancelled run, and their ids."""
    t = scope.view
    t.publish(gate="approval")
    with scope.http(Role.REQUESTER, Role.REVIEWER) as http:

        def submit() -> str:
            answer = http.post(
                "/factory/runs",
                json=t.body(),
                headers={"Idempotency-Key": f"key-{uuid.uuid4().hex}"},
            )
            assert answer.status_code == 202, answer.text
            return str(answer.json()["runId"])

        waiting = submit()
        approval = t.request_approval(t.claim(waiting))
        assert approval is not None
        scope.approvals.append(str(approval.approval_id))
        approved = submit()
        granted = t.request_approval(t.claim(approved))
        decided = http.post(
            f"/factory/approvals/{granted.approval_id}/decision",
            json={
                "decision": "approve",
                "version": granted.version,
                "proposalHash": granted.proposal_hash,
                "reason": "fine",
            },
            headers={
                "Authorization": f"Bearer {t.token('rita', Role.REVIEWER, project=scope.project)}"
            },
        )
        assert decided.status_code == 200, decided.text
        scope.approvals.append(str(granted.approval_id))
        t.succeed(t.claim(approved))  # the decision resumed the parked attempt
        cancelled = submit()
        stopped = http.post(f"/factory/runs/{cancelled}/cancel", json={"reason": "seeded"})
        assert stopped.status_code == 202, stopped.text
        scope.runs += [waiting, approved, cancelled]
        for run_id in scope.runs:
            scope.ids.add(run_id)
            _collect(http.get(f"/factory/runs/{run_id}").json(), scope.ids)
            _collect(http.get(f"/factory/runs/{run_id}/events/history").json(), scope.ids)
        _collect(http.get("/factory/approvals").json(), scope.ids)
    scope.ids.update(scope.approvals)


@dataclass
class World:
    api: Api
    scopes: dict[str, Scope]

    def run_ids(self) -> list[str]:
        return [r for s in self.scopes.values() for r in s.runs]

    def approval_ids(self) -> list[str]:
        return [a for s in self.scopes.values() for a in s.approvals]


@contextmanager
def seeded_world(api: Api, runtime: Any, tenant_a: str, tenant_b: str) -> Iterator[World]:
    """The three scopes of tenants A and B seeded through ``api`` and ``runtime``'s worker
    client (test_cross_scope_fuzz_shards.py gives it A and B on two databases)."""
    scopes = {
        "A/P1": Scope("a1", TenantView(api, runtime, tenant_a), P1),
        "A/P2": Scope("a2", TenantView(api, runtime, tenant_a), P2),
        "B/P1": Scope("b1", TenantView(api, runtime, tenant_b), P1),
    }
    for scope in scopes.values():
        _seed(scope)
    for name, scope in scopes.items():
        others = set().union(*(s.ids for n, s in scopes.items() if n != name))
        assert not scope.ids & others
        assert len(scope.runs) == 3 and len(scope.approvals) == 2
    try:
        yield World(api, scopes)
    finally:
        for scope in scopes.values():
            scope.view.close()


@pytest.fixture(scope="module")
def world(api: Api, ray_runtime: Any) -> Iterator[World]:
    with seeded_world(api, ray_runtime, new_tenant(), new_tenant()) as seeded:
        yield seeded


# caller: (its scope, its roles, the scopes it may see)
CALLERS = {
    "project-A/P1": ("A/P1", (Role.REQUESTER, Role.REVIEWER, Role.OBSERVER), {"A/P1"}),
    "operator-A": ("A/P1", (Role.OPERATOR, Role.REQUESTER, Role.REVIEWER), {"A/P1", "A/P2"}),
    "operator-B": ("B/P1", (Role.OPERATOR, Role.REQUESTER, Role.REVIEWER), {"B/P1"}),
}


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    leaks: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)


def _send(http: httpx.Client, case: Any) -> tuple[int, str, str]:
    """Send ``case``; answer (status, text of the headers, body). A stream (any answer of type
    ``text/event-stream``) is read up to its first heartbeat after what it replays, its end,
    or ``MAX_STREAM_S``."""
    kwargs = case.as_transport_kwargs(base_url=str(http.base_url).rstrip("/"))
    request = http.build_request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params"),
        headers={k: v for k, v in kwargs["headers"].items() if k != "Authorization"},
        json=kwargs.get("json"),
        content=kwargs.get("data"),
    )
    response = http.send(request, stream=True)
    try:
        headers = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        if not streamed:
            return response.status_code, headers, response.read().decode("utf-8", "replace")
        lines: list[str] = []
        deadline = time.monotonic() + MAX_STREAM_S
        for line in response.iter_lines():
            if line.startswith(":") or len(lines) >= MAX_STREAM_LINES:
                break
            lines.append(line)
            assert time.monotonic() < deadline, f"a stream sent no heartbeat in {MAX_STREAM_S} s"
        return response.status_code, headers, "\n".join(lines)
    finally:
        response.close()


def _asked(case: Any) -> str:
    return json.dumps(
        [case.path_parameters, case.query, case.headers, case.body], default=str
    ).lower()


def _fuzz(
    http: httpx.Client,
    operation: Any,
    ids: dict[str, list[str]],
    foreign: set[str],
    tally: Tally,
) -> None:
    """``EXAMPLES`` generated cases of ``operation``, each checked for another scope's ids."""
    operation_id = operation.definition.raw["operationId"]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(), data=st.data())
    def fuzz(case: Any, data: st.DataObject) -> None:
        for param in list(case.path_parameters or {}):
            known = ids.get(param)
            if known:
                case.path_parameters[param] = data.draw(
                    st.one_of(st.just(case.path_parameters[param]), st.sampled_from(known))
                )
        status, headers, body = _send(http, case)
        tally.requests[operation_id] += 1
        tally.statuses[status] += 1
        answer, asked = (headers + "\n" + body).lower(), _asked(case)
        named = {i for i in foreign if i in answer and i not in asked}
        if named:
            tally.leaks.append(f"{operation_id} {status}: {sorted(named)}")
        assert not named, f"{operation_id} answered {status} naming {named}: {body[:500]}"
        if any(i in asked for i in foreign):
            assert status >= 400, f"{operation_id} with another scope's id answered {status}"

    fuzz()


def fuzz_as(world: World, caller: str) -> Tally:
    """Every operation fuzzed as ``caller``, each answer checked for the ids of the scopes it may
    not see; the tally of requests, leaks and statuses."""
    home, roles, visible = CALLERS[caller]
    scope = world.scopes[home]
    foreign = set().union(*(s.ids for n, s in world.scopes.items() if n not in visible))
    assert foreign
    tally = Tally()
    token = scope.view.token(f"fuzz-{caller}", *roles, project=scope.project)
    ids = {"runId": world.run_ids(), "approvalId": world.approval_ids()}
    with world.api.client(token) as http:
        try:
            for operation in OPERATIONS:
                _fuzz(http, operation, ids, foreign, tally)
        finally:
            for subscription in http.get("/factory/webhooks").json().get("items", []):
                http.delete(f"/factory/webhooks/{subscription['subscriptionId']}")

    return tally


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_no_answer_names_another_scopes_ids(world: World, caller: str) -> None:
    tally = fuzz_as(world, caller)
    total = sum(tally.requests.values())
    print(f"\n{caller}: {total} requests over {len(tally.requests)} operations, leaks 0")
    assert set(tally.requests) == {o.definition.raw["operationId"] for o in OPERATIONS}
    assert not tally.leaks
