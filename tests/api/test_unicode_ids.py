"""Ids drawn from all of Unicode (issue 40 item 6): no route that echoes an id into a header or
a path answers 5xx. An id holds letters, marks, numbers, punctuation, symbols and spaces of any
script (``domain.limits.name``); anything else is a 422 problem, and an id published travels
percent-encoded in its ``Location``, which leads back to it.

Over real HTTP to the real Serve app: each example publishes a release under the drawn id and
an alias of it, reads the workflow by path and the runs by query, moves the alias, submits a
run of it, sends a signal of that name and asks for its A2A agent card.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
from api_harness import TenantView
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runcontrol.domain import Role
from runcontrol.domain.errors import ValidationFailed
from runcontrol.domain.limits import name

EXAMPLES = 30
# Every code point, surrogates and unassigned ones included.
ANY_ID = st.text(st.characters(exclude_categories=()), min_size=1, max_size=12)


def segment(value: str) -> str:
    """``value`` as a URL path segment (a lone surrogate as its WTF-8 bytes)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def send(http: httpx.Client, method: str, path: str, body: Any = None, **headers: str) -> Any:
    """The request's answer, after checking it is no 5xx (a body as ASCII JSON: a lone
    surrogate travels as its escape, as a client would send it)."""
    content = None if body is None else json.dumps(body)
    response = http.request(
        method, path, content=content, headers={"Content-Type": "application/json", **headers}
    )
    assert response.status_code < 500, (method, path, response.status_code, response.text)
    return response


def an_id(value: str) -> bool:
    try:
        name(value, "id", segment=True)
    except ValidationFailed:
        return False
    return True


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(workflow_id=ANY_ID, alias=ANY_ID)
@example(workflow_id="名前", alias="最新")
@example(workflow_id="café", alias="a b")
@example(workflow_id="\u202eevil", alias="..")
@example(workflow_id="a%2Fb", alias="\U0001f600")
@example(workflow_id="\x00", alias="\ud800")  # the A2A door once read a NUL id: a 500
def test_no_id_is_a_server_error(t: TenantView, workflow_id: str, alias: str) -> None:
    admin = t.user("wanda", Role.WORKSPACE_ADMIN)
    requester = t.requester()
    wf = segment(workflow_id)
    steps = [{"name": "s0", "agentId": t.agent}]
    definition = {"workflowId": workflow_id, "steps": steps}
    published = send(admin, "POST", "/factory/releases", {"definition": definition})
    if an_id(workflow_id):
        assert published.status_code == 201, published.text
        location = published.headers["Location"]
        assert location == f"/factory/workflows/{quote(workflow_id, safe='')}"
        assert send(requester, "GET", location).json()["workflowId"] == workflow_id
    else:
        assert published.status_code == 422, published.text
    aliased = send(
        admin, "POST", "/factory/releases", {"definition": definition, "aliases": [alias]}
    )
    assert aliased.status_code == (201 if an_id(workflow_id) and an_id(alias) else 422), (
        aliased.text
    )
    send(requester, "GET", f"/factory/workflows/{wf}")
    moved = {"releaseId": f"{workflow_id}@0000000000000000"}
    send(admin, "PUT", f"/factory/workflows/{wf}/aliases/{segment(alias)}", moved)
    send(requester, "GET", f"/factory/runs?workflowId={wf}")
    key = {"Idempotency-Key": f"key-{uuid.uuid4().hex}"}
    send(requester, "POST", "/factory/runs", t.body(workflowId=workflow_id), **key)
    send(requester, "POST", f"/factory/runs/{uuid.uuid4()}/signals/{segment(alias)}", {}, **key)
    send(requester, "GET", f"/a2a/{wf}/.well-known/agent-card.json")
