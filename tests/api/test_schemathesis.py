"""Property-based API testing from the OpenAPI document: no generated request may cause a 5xx.

The document is the app's own (``create_app(...).openapi()``, built at collection time, when no
server runs yet); ``test_the_served_document_is_the_one_tested`` proves that the live
``/openapi.json`` is exactly it. Every case is sent over HTTP to the session's Serve instance
with a valid token (all scopes) of a fresh tenant, so requests get past authentication and
exercise validation, routing and the mapping of domain errors. Bounded by ``MAX_EXAMPLES``
per operation, so it stays a smoke test of the whole surface.

(``schemathesis.pytest.from_fixture`` would load the live document directly, but its lazy
loader reads ``Function._nodeid``, which pytest 9.2 no longer has.)
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from api_harness import SECRET, Api, new_tenant
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from runcontrol.api import create_app
from runcontrol.client import RunControlClient
from runcontrol.config import Settings
from runcontrol.domain import Role
from runcontrol.store import Database

MAX_EXAMPLES = 25

_document_only = create_app(
    RunControlClient(router=None),  # type: ignore[arg-type]
    Database("postgresql+psycopg://unused@localhost/unused"),
    Settings(auth={"hs256_secret": SECRET}),
)
DOCUMENT: dict[str, Any] = _document_only.openapi()
# The tenant-wide live feed never ends (a stream of every future event): each generated case
# would hold the connection until its timeout. Its history twin, which is finite, is tested.
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(operation_id="StreamEventFeed")


@pytest.fixture(scope="session")
def fuzz_token(api: Api) -> str:
    return api.token(new_tenant(), "fuzzer", [Role.REVIEWER, Role.REQUESTER])


def test_the_served_document_is_the_one_tested(api: Api) -> None:
    with api.client() as http:
        served = http.get("/openapi.json")
    assert served.status_code == 200
    assert served.json() == DOCUMENT


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_causes_a_server_error(case: Any, api: Api, fuzz_token: str) -> None:
    case.call_and_validate(
        base_url=api.base_url,
        headers={"Authorization": f"Bearer {fuzz_token}"},
        checks=[not_a_server_error],
        timeout=30,
    )
