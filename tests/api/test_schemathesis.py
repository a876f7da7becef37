"""Property-based API testing from /openapi.json: no generated request may cause a 5xx.

Bounded (``max_examples`` per operation) so it stays a smoke test of the whole surface. Every
case carries a valid token (all scopes, Reviewer) of a fresh tenant, so requests get past
authentication and exercise validation, routing and the domain's error mapping.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from api_harness import Api, new_tenant
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from runcontrol.domain import Role

MAX_EXAMPLES = 25


@pytest.fixture(scope="session")
def api_schema(api: Api) -> Any:
    return schemathesis.openapi.from_url(f"{api.base_url}/openapi.json")


@pytest.fixture(scope="session")
def fuzz_token(api: Api) -> str:
    return api.token(new_tenant(), "fuzzer", [Role.REVIEWER, Role.REQUESTER])


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_causes_a_server_error(case: Any, fuzz_token: str) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {fuzz_token}"},
        checks=[not_a_server_error],
        timeout=30,
    )
