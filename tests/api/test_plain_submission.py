"""``POST /factory/runs`` served by a plain handler (issue 42): what FastAPI's stack gave it and
the handler keeps (real Serve, Ray and Postgres). The order of the refusals (a body that is not
JSON first, then the caller, then the headers and the body, one 422 for all of them), each a
problem+json and never a 5xx, and the route's OpenAPI description."""

from __future__ import annotations

from typing import Any

import pytest
from api_harness import Api, TenantView, assert_problem

from runcontrol.domain import Role

INVALID = {"input": "not an object"}  # no workflowId nor modelProfileId, a string for input


def post(http: Any, content: bytes, content_type: str | None, **headers: str) -> Any:
    if content_type is not None:
        headers["Content-Type"] = content_type
    return http.post("/factory/runs", content=content, headers=headers)


def test_the_caller_is_refused_before_the_body_is_checked(t: TenantView, api: Api) -> None:
    body = b'{"input": "not an object"}'
    with api.client() as anonymous:
        response = post(anonymous, body, "application/json")
    assert_problem(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")
    with api.client(**{"Authorization": f"Basic {t.token()}"}) as basic:
        assert_problem(post(basic, body, "application/json"), 401, "unauthorized")
    observer = t.user("olga", Role.OBSERVER)
    response = post(observer, body, "application/json", **{"Idempotency-Key": "k"})
    assert_problem(response, 403)


def test_a_body_that_is_not_json_is_refused_first(t: TenantView, api: Api) -> None:
    with api.client() as anonymous:  # as FastAPI read it: before the caller
        body = assert_problem(post(anonymous, b"{not json", "application/json"), 422)
    assert body["errors"][0]["type"] == "json_invalid"
    assert body["errors"][0]["in"] == "body"
    http = t.requester()
    key = {"Idempotency-Key": "not-json"}
    assert_problem(post(http, b'{"a": "\xff"}', "application/json", **key), 400)
    for content_type in ("text/plain", None):  # JSON under another type, or none, is no body
        response = post(http, b'{"workflowId": "w"}', content_type, **key)
        assert_problem(response, 422, "request-invalid")
    missing = assert_problem(post(http, b"", "application/json", **key), 422)
    assert [(e["in"], e["type"]) for e in missing["errors"]] == [("body", "missing")]


def test_headers_and_body_are_checked_together(t: TenantView) -> None:
    headers = {"Idempotency-Key": "k" * 256, "X-Correlation-Id": "c" * 201}
    response = t.requester().post("/factory/runs", json=INVALID, headers=headers)
    body = assert_problem(response, 422, "request-invalid")
    found = [(e["in"], e["field"]) for e in body["errors"]]
    assert found[:2] == [("header", "Idempotency-Key"), ("header", "X-Correlation-Id")]
    assert {("body", "workflowId"), ("body", "modelProfileId"), ("body", "input")} <= set(found)


@pytest.fixture(scope="module")
def described(api: Api) -> dict[str, Any]:
    with api.client() as http:
        document: dict[str, Any] = http.get("/openapi.json").json()
    operation: dict[str, Any] = document["paths"]["/factory/runs"]["post"]
    return operation


def test_the_route_keeps_its_openapi_description(described: dict[str, Any]) -> None:
    assert described["operationId"] == "SubmitRun"
    assert described["tags"] == ["runs"]
    assert described["summary"].startswith("Accept a run")
    body = described["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmitRunBody"
    }
    parameters = {p["name"]: p for p in described["parameters"]}
    assert set(parameters) == {"Idempotency-Key", "X-Correlation-Id", "prefer"}
    assert {p["in"] for p in parameters.values()} == {"header"}
    key = parameters["Idempotency-Key"]["schema"]["anyOf"]
    assert {"type": "string", "maxLength": 255} in key
    responses = described["responses"]
    schema = {
        code: r["content"]["application/json"]["schema"]
        for code, r in responses.items()
        if "application/json" in r.get("content", {})
    }
    assert schema == {
        "202": {"$ref": "#/components/schemas/SubmitRunResponse"},
        "200": {"$ref": "#/components/schemas/RunView"},
    }
    problems = {code for code, r in responses.items() if "application/problem+json" in r["content"]}
    assert problems == {"400", "401", "403", "404", "409", "413", "422", "429", "503"}
    assert described["security"] == [{"HTTPBearer": []}]
