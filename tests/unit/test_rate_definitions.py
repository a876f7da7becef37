"""Rate-limit definitions (issue 21 item 2): a policy revision's ``rateLimits`` and a release
step's ``rateLimits`` are checked where they are published (``ValidationFailed``: 422 at
HTTP), and documents without them keep their dict and hash unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from runcontrol.domain import PolicyDocument, StepSpec, WorkflowDefinition, errors
from runcontrol.domain.rates import Draw, Rate, RateLimits, draws
from runcontrol.ports.policy import document_from_dict, document_to_dict


def policy(rate_limits: Any) -> PolicyDocument:
    return document_from_dict("default", "1", {"rateLimits": rate_limits})


@pytest.mark.parametrize(
    ("rate_limits", "message"),
    [
        ([], "rateLimits must be an object"),
        ({"tenants": {}}, "unknown keys tenants"),
        ({"tenant": {"perSecond": 0}}, "rateLimits.tenant.perSecond"),
        ({"tenant": {"perSecond": "5"}}, "rateLimits.tenant.perSecond"),
        ({"tenant": {"perSecond": 5, "burst": 0.5}}, "rateLimits.tenant.burst"),
        ({"tenant": {"perSecond": 5, "rate": 1}}, "rateLimits.tenant must be"),
        ({"agents": {"planner": {"burst": 3}}}, "rateLimits.agents.planner.perSecond"),
        ({"named": []}, "rateLimits.named must be an object"),
        ({"named": {"": {"perSecond": 1}}}, "a name must be 1 to 200"),
    ],
)
def test_a_bad_policy_rate_limit_is_refused_naming_its_field(
    rate_limits: Any, message: str
) -> None:
    with pytest.raises(errors.ValidationFailed, match=message):
        policy(rate_limits)


def test_a_policy_rate_limit_round_trips_and_its_absence_changes_nothing() -> None:
    doc = policy({"tenant": {"perSecond": 5, "burst": 10}, "named": {"tok": {"perSecond": 100}}})
    assert doc.rate_limits == RateLimits(Rate(5.0, 10.0), {}, {"tok": Rate(100.0, 1.0)})
    again = document_from_dict("default", "2", document_to_dict(doc))
    assert again.rate_limits == doc.rate_limits
    assert "rateLimits" not in document_to_dict(PolicyDocument("default", "0"))


def workflow(step: dict[str, Any]) -> WorkflowDefinition:
    return WorkflowDefinition.from_dict(
        {"workflowId": "wf", "steps": [{"name": "s", "agentId": "a", **step}]}
    )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ([], "non-empty list"),
        ({"name": "tok"}, "non-empty list"),
        ([{"name": "", "units": 1}], "name must be 1 to 200"),
        ([{"name": "tok", "units": 0}], "units must be a number above 0"),
        ([{"name": "tok", "units": True}], "units must be a number above 0"),
        ([{"name": "tok"}, {"name": "tok"}], "names 'tok' twice"),
        ([{"name": "tok", "weight": 1}], "is {name, units}"),
    ],
)
def test_a_bad_step_rate_limit_is_refused(limits: Any, message: str) -> None:
    with pytest.raises(errors.ValidationFailed, match=message):
        workflow({"rateLimits": limits})


def test_a_step_without_rate_limits_keeps_its_dict_and_hash() -> None:
    plain = workflow({})
    assert "rateLimits" not in plain.to_dict()["steps"][0]
    assert plain.content_hash == WorkflowDefinition("wf", (StepSpec("s", "a"),)).content_hash
    limited = workflow({"rateLimits": [{"name": "tok", "units": 3}]})
    assert limited.steps[0].rate_limits == (("tok", 3),)
    assert limited.content_hash != plain.content_hash


def test_a_steps_draws_are_the_tenants_its_agents_and_its_named_limits() -> None:
    limits = RateLimits(Rate(5, 5), {"planner": Rate(1, 2)}, {"tok": Rate(100, 50)})
    assert draws(limits, "planner", (("tok", 3),)) == [
        Draw("tenant", 5, 5, 1),
        Draw("agent:planner", 1, 2, 1),
        Draw("named:tok", 100, 50, 3),
    ]
    assert draws(None, "planner", None) == []
    assert draws(limits, "other", None) == [Draw("tenant", 5, 5, 1)]
    with pytest.raises(errors.ValidationFailed, match="does not define"):
        draws(limits, "planner", (("missing", 1),))
    with pytest.raises(errors.ValidationFailed, match="more than its burst"):
        draws(limits, "planner", (("tok", 51),))
