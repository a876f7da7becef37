"""Bearer-token authentication and scopes: 401 without a valid token, 403 without the scope."""

from __future__ import annotations

import time

import jwt
import pytest
from api_harness import AUDIENCE, ISSUER, PROJECT, SECRET, Api, TenantView, assert_problem
from cryptography.hazmat.primitives.asymmetric import rsa

from runcontrol.api import mint_dev_token
from runcontrol.api.auth import (
    APPROVALS_DECIDE,
    APPROVALS_READ,
    RUNS_READ,
    RUNS_WRITE,
    RUNTIME,
)
from runcontrol.domain import Role

PROTECTED = [
    ("GET", "/factory/runs"),
    ("GET", "/factory/runs/00000000-0000-0000-0000-000000000001"),
    ("GET", "/factory/runs/00000000-0000-0000-0000-000000000001/events"),
    ("GET", "/factory/runs/00000000-0000-0000-0000-000000000001/events/history"),
    ("POST", "/factory/runs"),
    ("POST", "/factory/runs/00000000-0000-0000-0000-000000000001/cancel"),
    ("GET", "/factory/approvals"),
    ("POST", "/factory/approvals/00000000-0000-0000-0000-000000000001/decision"),
]


def claims(tenant: str, **overrides: object) -> dict[str, object]:
    now = int(time.time())
    body: dict[str, object] = {
        "sub": "alice",
        "tid": tenant,
        "pid": PROJECT,
        "roles": ["Requester"],
        "scope": " ".join([RUNS_READ, RUNS_WRITE]),
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 600,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def hs256(body: dict[str, object], secret: str = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(body, secret, algorithm=alg)


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_every_factory_route_needs_a_token(api: Api, method: str, path: str) -> None:
    with api.client() as http:
        response = http.request(method, path, json={})
    body = assert_problem(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "token" in body["detail"]


def test_bad_tokens_are_401(api: Api, tenant: str) -> None:
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = {
        "garbage": "not-a-jwt",
        "wrong secret": hs256(claims(tenant), secret="another-secret-0123456789abcdef-xyz"),
        "expired": hs256(claims(tenant, iat=int(time.time()) - 7200, exp=int(time.time()) - 3600)),
        "no expiry": hs256(claims(tenant, exp=None)),
        "wrong issuer": hs256(claims(tenant, iss="https://evil.example/")),
        "wrong audience": hs256(claims(tenant, aud="someone-else")),
        "no tenant": hs256(claims(tenant, tid=None)),
        "no project": hs256(claims(tenant, pid=None)),
        "empty subject": hs256(claims(tenant, sub="")),
        "alg none": jwt.encode(claims(tenant), None, algorithm="none"),
        "HS512": hs256(claims(tenant), alg="HS512"),
        "unknown RSA key": api.rs256_token(claims(tenant), key=other_key),
        "unknown kid": api.rs256_token(claims(tenant), kid="other-kid"),
    }
    for name, token in bad.items():
        with api.client(token) as http:
            response = http.get("/factory/runs")
        assert_problem(response, 401, "unauthorized")
        assert 'error="invalid_token"' in response.headers["www-authenticate"], name

    with api.client(**{"Authorization": f"Basic {SECRET}"}) as http:
        assert_problem(http.get("/factory/runs"), 401, "unauthorized")


def test_rs256_tokens_verified_against_the_jwks(api: Api, tenant: str) -> None:
    with api.client(api.rs256_token(claims(tenant))) as http:
        response = http.get("/factory/runs")
    assert response.status_code == 200, response.text


def test_mint_dev_token_grants_all_factory_scopes(api: Api, tenant: str) -> None:
    token = mint_dev_token(
        SECRET, tenant, PROJECT, "dev", [Role.REQUESTER], issuer=ISSUER, audience=AUDIENCE
    )
    decoded = jwt.decode(token, SECRET, algorithms=["HS256"], audience=AUDIENCE)
    assert set(decoded["scope"].split()) == {
        RUNS_READ,
        RUNS_WRITE,
        APPROVALS_READ,
        APPROVALS_DECIDE,
        RUNTIME,
    }
    assert (decoded["tid"], decoded["pid"], decoded["sub"]) == (tenant, PROJECT, "dev")
    with api.client(token) as http:
        assert http.get("/factory/approvals").status_code == 200


def test_a_missing_scope_is_403(t: TenantView) -> None:
    t.publish()
    reader = t.user("reader", Role.OBSERVER, scopes=[RUNS_READ])
    response = reader.post("/factory/runs", json=t.body(), headers={"Idempotency-Key": "r"})
    body = assert_problem(response, 403, "insufficient-scope")
    assert RUNS_WRITE in body["detail"]
    assert 'error="insufficient_scope"' in response.headers["www-authenticate"]
    assert_problem(reader.get("/factory/approvals"), 403, "insufficient-scope")
    assert_problem(
        reader.post(
            "/factory/approvals/00000000-0000-0000-0000-000000000001/decision",
            json={"decision": "approve", "version": 1, "proposalHash": "h"},
        ),
        403,
        "insufficient-scope",
    )

    writer = t.user("writer", Role.REQUESTER, scopes=[RUNS_WRITE])
    assert_problem(writer.get("/factory/runs"), 403, "insufficient-scope")
    run_id = t.submit(writer)
    assert_problem(writer.get(f"/factory/runs/{run_id}"), 403, "insufficient-scope")
    assert_problem(writer.get(f"/factory/runs/{run_id}/events/history"), 403, "insufficient-scope")


def test_health_and_openapi_need_no_token(api: Api) -> None:
    with api.client() as http:
        assert http.get("/health/live").json() == {"status": "live", "checks": {}}
        ready = http.get("/health/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"database": "ok", "runHosts": "ok"}
        spec = http.get("/openapi.json").json()
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "SubmitRun",
        "GetRun",
        "ListRuns",
        "CancelRun",
        "DecideApproval",
        "ListApprovals",
        "StreamRunEvents",
        "GetRunEventHistory",
    } <= operations
    submit = spec["components"]["schemas"]["SubmitRunRequest"]["properties"]
    assert {"workflowId", "releaseAlias", "releaseId", "modelProfileId", "input", "limits"} <= set(
        submit
    )
