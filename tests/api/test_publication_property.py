"""Invariant 15 as a property (issue 34): a definition accepted at publication can be submitted
against without a 5xx, and a refused one leaves nothing stored.

Hypothesis generates release definitions and policy documents, valid, near-valid (each limit
of ``domain/limits.py`` and one past it) and hostile (control and format characters, path
separators, integers past 64 bits, wrong types). Each example gets a tenant of its own, so
"nothing stored" is exact: over real HTTP to the real Serve app and database, the policy is
published, then the release; each is a 201, or a 4xx problem after which the tenant's policy
is still the built-in one (or its workflows still none). When both are accepted, a run is
submitted against the release: a 202 or a 4xx problem, never a 5xx.

``make test`` runs ``SHORT`` examples; ``make test-long`` runs ``RUNCONTROL_PUBLICATION_EXAMPLES``
(default 10,000). The count of each outcome is printed (``-s``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import httpx
import pytest
from api_harness import PROBLEM, Api, new_tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runcontrol.domain import Role, SideEffectClass, limits

SHORT = 60
LONG = int(os.environ.get("RUNCONTROL_PUBLICATION_EXAMPLES", "10000"))

HOSTILE_TEXT = st.sampled_from(
    [
        "",
        " ",
        " x",
        "../../etc/passwd",
        "a/b",
        "a\\b",
        ".",
        "..",
        "\t\n",
        "\u202eevil",
        "acc-\ufeff-956",
        "\x00",
        "\ud800",
    ]
) | st.sampled_from(  # long ones built, so that the strategies' reprs stay short
    [("x", limits.MAX_WORKFLOW_ID + 1), ("x", limits.MAX_NAME + 1), ("x", 17_000), (" ", 10_000)]
).map(lambda pair: pair[0] * pair[1])
NAME = st.text(
    st.characters(codec="ascii", categories=["L", "N"], include_characters="-_."),
    min_size=1,
    max_size=12,
)
EDGE_NAME = st.sampled_from([limits.MAX_WORKFLOW_ID, limits.MAX_NAME]).map(lambda n: "x" * n) | (
    st.sampled_from(["é-ü", "a.b"])
)
HUGE = st.sampled_from([31, 32, 63, 64, 66, 1329]).map(lambda bits: 2**bits) | st.sampled_from(
    [2**31 - 1, -1, 0]
)
JSON_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
ANY_JSON = st.recursive(
    JSON_SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def text_field(hostile: bool) -> st.SearchStrategy[Any]:
    valid = st.one_of(NAME, NAME, NAME, EDGE_NAME)
    return st.one_of(valid, HOSTILE_TEXT, ANY_JSON) if hostile else valid


def key(hostile: bool) -> st.SearchStrategy[str]:
    """A JSON object's key: a string, hostile or not."""
    return st.one_of(NAME, EDGE_NAME, HOSTILE_TEXT) if hostile else st.one_of(NAME, EDGE_NAME)


def count(hostile: bool) -> st.SearchStrategy[Any]:
    valid = st.one_of(st.integers(1, 5), st.just(limits.MAX_ATTEMPTS))
    return st.one_of(valid, HUGE, ANY_JSON) if hostile else valid


def number(hostile: bool, low: float = 0.5) -> st.SearchStrategy[Any]:
    valid = st.one_of(st.integers(max(1, int(low)), 100), st.floats(low, 1e3))
    odd = st.sampled_from([1e-300, 1e-9, 1e308, 1.5, 0, -1, 366 * 86400]) | HUGE
    return st.one_of(valid, odd, ANY_JSON) if hostile else valid


def one_of_kind(hostile: bool) -> st.SearchStrategy[Any]:
    kinds = ["agent", "agent", "wait", "signal"]
    return st.sampled_from([*kinds, "bogus"] if hostile else kinds)


def step(hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    h = hostile
    return st.fixed_dictionaries(
        {"agentId": text_field(h), "kind": one_of_kind(h)},
        optional={
            "name": text_field(h),
            "maxAttempts": count(h),
            "gate": st.sampled_from(["none", "approval", *(["manual", 1] if h else [])]),
            "sideEffectClass": st.sampled_from([str(c) for c in SideEffectClass])
            | (ANY_JSON if h else st.nothing()),
            "skillId": text_field(h),
            "seconds": number(h, 0),
            "until": st.sampled_from(
                [
                    "2026-01-01T00:00:00+00:00",
                    *(["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00", "x"] if h else []),
                ]
            ),
            "signal": text_field(h),
            "timeoutSeconds": number(h, 1),
            "dependsOn": st.lists(text_field(h), max_size=2) if h else st.just([]),
            "concurrency": st.lists(
                st.fixed_dictionaries(
                    {
                        "key": st.sampled_from(
                            ['"k"', "input.repository", *(["input.x", "bad ("] if h else [])]
                        ),
                        "limit": count(h),
                    },
                    optional={
                        "strategy": st.sampled_from(["queue", "cancel-newest", "bogus"]),
                        "name": text_field(h),
                    },
                ),
                min_size=1,
                max_size=2,
            ),
            "rateLimits": st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["tokens", "calls"]) | text_field(h)},
                    optional={"units": number(h)},
                ),
                min_size=1,
                max_size=2,
            ),
        },
    )


def definition(hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "workflowId": text_field(hostile),
            "steps": st.lists(step(hostile), min_size=1, max_size=3),
        }
    )


def rate(hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"perSecond": number(hostile, 1e-3)}, optional={"burst": number(hostile, 1)}
    )


def policy(hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    h = hostile
    return st.fixed_dictionaries(
        {},
        optional={
            "requiredApprovals": count(h) if h else st.integers(1, 3),
            "assignees": st.lists(text_field(h), max_size=3) if h else st.just([]),
            "expiryHours": number(h),
            "expiryAction": st.sampled_from(["fail", "reject", "re-request", *(["bogus"] * h)]),
            "maxReRequests": count(h) if h else st.integers(0, 5),
            "approverRoles": st.lists(
                st.sampled_from([str(Role.REVIEWER), *(["Nobody"] * h)]), min_size=1, max_size=2
            ),
            "rateLimits": st.fixed_dictionaries(
                {},
                optional={
                    "tenant": rate(h),
                    "agents": st.dictionaries(key(h), rate(h), max_size=2),
                    "named": st.dictionaries(
                        st.sampled_from(["tokens", "calls"]) | key(h), rate(h), max_size=2
                    ),
                },
            ),
        },
    )


# Valid documents twice as often as hostile ones, so that most submissions are tried.
DEFINITION = st.one_of(definition(False), definition(False), definition(True), ANY_JSON)
POLICY = st.one_of(st.just({}), policy(False), policy(False), policy(True))
INPUT = st.one_of(
    st.just({"repository": "r"}), st.dictionaries(st.text(max_size=4), ANY_JSON, max_size=3)
)


class Outcomes(Counter[str]):
    def check(self, what: str, response: httpx.Response) -> bool:
        """Whether ``response`` accepted; a refusal must be a 4xx problem, never a 5xx."""
        assert response.status_code < 500, (what, response.status_code, response.text[:2000])
        if response.status_code < 300:
            self[f"{what} accepted"] += 1
            return True
        assert response.headers["content-type"].startswith(PROBLEM), (what, response.text[:500])
        self[f"{what} refused {response.status_code}"] += 1
        return False


def _json(value: Any, **headers: str) -> dict[str, Any]:
    """As a client sends it: 10**400 as its digits, a lone surrogate escaped."""
    return {
        "content": json.dumps(value).encode(),
        "headers": {"Content-Type": "application/json", **headers},
    }


def publish_then_submit(
    api: Api, outcomes: Outcomes, policy: Any, definition: Any, run_input: Any
) -> None:
    tenant = new_tenant()
    with (
        api.client(api.token(tenant, "wanda", (Role.WORKSPACE_ADMIN,))) as admin,
        api.client(api.token(tenant)) as requester,
    ):
        if not outcomes.check("policy", admin.post("/factory/policies", **_json(policy))):
            assert requester.get("/factory/workflows").status_code == 200
            current = admin.get("/factory/policies/current")
            assert current.status_code == 200 and current.json()["revision"] == "0", current.text
        published = admin.post("/factory/releases", **_json({"definition": definition}))
        if not outcomes.check("release", published):
            listed = requester.get("/factory/workflows")
            assert listed.status_code == 200 and listed.json()["items"] == [], listed.text
            return
        release = published.json()
        body = {
            "workflowId": release["workflowId"],
            "releaseId": release["releaseId"],
            "modelProfileId": "m",
            "input": run_input,
        }
        submitted = requester.post("/factory/runs", **_json(body, **{"Idempotency-Key": "k"}))
        outcomes.check("submission", submitted)


def run_property(api: Api, examples: int) -> Outcomes:
    outcomes = Outcomes()

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=examples <= SHORT,  # make test: the same documents every time
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(policy=POLICY, definition=DEFINITION, run_input=INPUT)
    def prop(policy: Any, definition: Any, run_input: Any) -> None:
        publish_then_submit(api, outcomes, policy, definition, run_input)

    prop()
    print(
        f"\n{sum(v for k, v in outcomes.items() if k.startswith('release'))} documents:",
        dict(outcomes),
    )
    return outcomes


def test_every_published_definition_runs_or_is_refused_whole(api: Api) -> None:
    outcomes = run_property(api, SHORT)
    for seen in (
        "policy accepted",
        "policy refused 422",
        "release accepted",
        "release refused 422",
    ):
        assert outcomes[seen], outcomes
    assert outcomes["submission accepted"], outcomes


@pytest.mark.long
def test_every_published_definition_runs_or_is_refused_whole_long(api: Api) -> None:
    run_property(api, LONG)
