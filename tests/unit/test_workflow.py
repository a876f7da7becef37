"""Workflow definitions (what a release pins) and policy documents (what a revision pins)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runcontrol.domain import (
    PolicyDocument,
    Role,
    SideEffectClass,
    StepSpec,
    WorkflowDefinition,
    canonical_hash,
    errors,
)
from runcontrol.domain.hashing import is_hash

DEFINITION = {
    "workflowId": "repository-assessment",
    "steps": [
        {"name": "clone", "agentId": "git-agent"},
        {
            "name": "assess",
            "agentId": "code-agent",
            "skillId": "review",
            "maxAttempts": 5,
            "sideEffectClass": "local-write",
        },
        {
            "name": "open-pr",
            "agentId": "git-agent",
            "gate": "approval",
            "sideEffectClass": "shared-write",
        },
    ],
}


def test_from_dict_reads_every_field_with_defaults():
    wf = WorkflowDefinition.from_dict(DEFINITION)
    assert wf.workflow_id == "repository-assessment"
    assert [s.name for s in wf.steps] == ["clone", "assess", "open-pr"]
    clone, assess, open_pr = wf.steps
    assert clone == StepSpec(name="clone", agent_id="git-agent")
    assert clone.skill_id is None and clone.max_attempts is None
    assert clone.gate == "none" and clone.side_effect_class is SideEffectClass.READ
    assert assess.skill_id == "review" and assess.max_attempts == 5
    assert assess.side_effect_class is SideEffectClass.LOCAL_WRITE
    assert open_pr.gate == "approval"
    assert open_pr.side_effect_class is SideEffectClass.SHARED_WRITE


def test_unnamed_steps_get_positional_names():
    wf = WorkflowDefinition.from_dict(
        {"workflowId": "w", "steps": [{"agentId": "a"}, {"agentId": "b", "name": ""}]}
    )
    assert [s.name for s in wf.steps] == ["step-1", "step-2"]


def test_null_gate_means_none():
    wf = WorkflowDefinition.from_dict(
        {"workflowId": "w", "steps": [{"agentId": "a", "gate": None}]}
    )
    assert wf.steps[0].gate == "none"


def test_to_dict_round_trips():
    wf = WorkflowDefinition.from_dict(DEFINITION)
    again = WorkflowDefinition.from_dict(wf.to_dict())
    assert again == wf
    assert again.content_hash == wf.content_hash
    assert wf.to_dict()["steps"][2] == {
        "name": "open-pr",
        "agentId": "git-agent",
        "skillId": None,
        "maxAttempts": None,
        "gate": "approval",
        "sideEffectClass": "shared-write",
    }


def test_content_hash_is_canonical_and_ignores_key_order():
    wf = WorkflowDefinition.from_dict(DEFINITION)
    assert is_hash(wf.content_hash)
    assert wf.content_hash == canonical_hash(wf.to_dict())
    reordered = {
        "steps": [dict(reversed(list(step.items()))) for step in DEFINITION["steps"]],
        "workflowId": DEFINITION["workflowId"],
    }
    assert WorkflowDefinition.from_dict(reordered).content_hash == wf.content_hash


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["steps"][0].update(agentId="other"),
        lambda d: d["steps"][1].update(maxAttempts=4),
        lambda d: d["steps"][2].update(gate="none"),
        lambda d: d["steps"][2].update(sideEffectClass="external-irreversible"),
        lambda d: d["steps"].reverse(),
        lambda d: d.update(workflowId="other"),
    ],
)
def test_any_meaningful_change_changes_the_content_hash(change):
    import copy

    changed = copy.deepcopy(DEFINITION)
    change(changed)
    assert (
        WorkflowDefinition.from_dict(changed).content_hash
        != WorkflowDefinition.from_dict(DEFINITION).content_hash
    )


def test_definitions_are_immutable():
    wf = WorkflowDefinition.from_dict(DEFINITION)
    with pytest.raises(AttributeError):
        wf.workflow_id = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        wf.steps[0].agent_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({}, "lacks"),
        ({"workflowId": "w"}, "lacks"),
        ({"steps": [{"agentId": "a"}]}, "lacks"),
        (None, "lacks"),
        ("not-a-dict", "lacks"),
        ({"workflowId": "", "steps": [{"agentId": "a"}]}, "workflowId must be 1 to 183"),
        ({"workflowId": "w", "steps": []}, "at least one step"),
        ({"workflowId": "w", "steps": {"agentId": "a"}}, "at least one step"),
        ({"workflowId": "w", "steps": [{"name": "x"}]}, r"steps\[0\]: agentId"),
        ({"workflowId": "w", "steps": ["agent"]}, r"steps\[0\]: agentId"),
        ({"workflowId": "w", "steps": [{"agentId": ""}]}, r"steps\[0\]: agentId"),
        (
            {
                "workflowId": "w",
                "steps": [{"agentId": "a", "name": "x"}, {"agentId": "b", "name": "x"}],
            },
            r"steps\[1\]: duplicate step name 'x'",
        ),
        (
            {"workflowId": "w", "steps": [{"agentId": "a"}, {"agentId": "b", "name": "step-1"}]},
            "duplicate",
        ),
        ({"workflowId": "w", "steps": [{"agentId": "a", "gate": "manual"}]}, "gate must be"),
        ({"workflowId": "w", "steps": [{"agentId": "a", "maxAttempts": 0}]}, "maxAttempts"),
        ({"workflowId": "w", "steps": [{"agentId": "a", "maxAttempts": -2}]}, "maxAttempts"),
        ({"workflowId": "w", "steps": [{"agentId": "a", "maxAttempts": "3"}]}, "maxAttempts"),
        ({"workflowId": "w", "steps": [{"agentId": "a", "maxAttempts": 2.5}]}, "maxAttempts"),
        ({"workflowId": "w", "steps": [{"agentId": "a", "maxAttempts": True}]}, "maxAttempts"),
        (
            {"workflowId": "w", "steps": [{"agentId": "a", "sideEffectClass": "write"}]},
            "sideEffectClass must be one of",
        ),
        ({"workflowId": None, "steps": [{"agentId": "a"}]}, "workflowId"),
    ],
)
def test_invalid_definitions_are_refused(data, match):
    with pytest.raises(errors.ValidationFailed, match=match):
        WorkflowDefinition.from_dict(data)


NAMES = st.text(st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=5)


@given(
    st.lists(
        st.fixed_dictionaries(
            {"agentId": NAMES},
            optional={
                "maxAttempts": st.integers(min_value=1, max_value=20),
                "gate": st.sampled_from(["none", "approval"]),
                "sideEffectClass": st.sampled_from([str(c) for c in SideEffectClass]),
                "skillId": NAMES,
            },
        ),
        min_size=1,
        max_size=6,
    )
)
def test_valid_definitions_round_trip(steps):
    wf = WorkflowDefinition.from_dict({"workflowId": "w", "steps": steps})
    assert len(wf.steps) == len(steps)
    assert WorkflowDefinition.from_dict(wf.to_dict()) == wf
    for spec, raw in zip(wf.steps, steps, strict=True):
        assert spec.agent_id == raw["agentId"]
        assert spec.max_attempts == raw.get("maxAttempts")
        assert str(spec.side_effect_class) == raw.get("sideEffectClass", "read")


# ---------------------------------------------------------------------------- policy


def test_policy_defaults():
    policy = PolicyDocument(policy_id="p", revision="1")
    assert policy.approval_required_for == {
        SideEffectClass.SHARED_WRITE,
        SideEffectClass.EXTERNAL_IRREVERSIBLE,
    }
    assert policy.approver_roles == {Role.REVIEWER, Role.WORKSPACE_ADMIN}
    assert Role.REQUESTER not in policy.approver_roles
    assert Role.PLATFORM_ADMIN not in policy.approver_roles  # break-glass only
    assert policy.required_approvals == 1
    assert policy.approver_rule == "roles:Reviewer|WorkspaceAdmin;not-requester;quorum:1"


def test_approver_rule_is_deterministic():
    a = PolicyDocument("p", "1", approver_roles=frozenset({Role.WORKSPACE_ADMIN, Role.REVIEWER}))
    b = PolicyDocument("p", "1", approver_roles=frozenset({Role.REVIEWER, Role.WORKSPACE_ADMIN}))
    assert a.approver_rule == b.approver_rule
    quorum = PolicyDocument(
        "p", "2", approver_roles=frozenset({Role.REVIEWER}), required_approvals=2
    )
    assert quorum.approver_rule == "roles:Reviewer;not-requester;quorum:2"


@pytest.mark.parametrize(
    ("action", "gate", "needed"),
    [
        (SideEffectClass.READ, "none", False),
        (SideEffectClass.LOCAL_WRITE, "none", False),
        (SideEffectClass.SHARED_WRITE, "none", True),
        (SideEffectClass.EXTERNAL_IRREVERSIBLE, "none", True),
        (SideEffectClass.READ, "approval", True),
        (SideEffectClass.LOCAL_WRITE, "approval", True),
    ],
)
def test_needs_approval(action, gate, needed):
    assert PolicyDocument("p", "1").needs_approval(action, gate) is needed


def test_needs_approval_follows_the_revision():
    lenient = PolicyDocument("p", "2", approval_required_for=frozenset())
    assert not lenient.needs_approval(SideEffectClass.EXTERNAL_IRREVERSIBLE, "none")
    assert lenient.needs_approval(SideEffectClass.READ, "approval")


def test_side_effect_classes_are_ordered():
    order = [
        SideEffectClass.READ,
        SideEffectClass.LOCAL_WRITE,
        SideEffectClass.SHARED_WRITE,
        SideEffectClass.EXTERNAL_IRREVERSIBLE,
    ]
    assert [c.rank for c in order] == [0, 1, 2, 3]
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            assert a.at_least(b) is (i >= j)
