"""Conditions (issue 32): the ``when`` language (parsed, never evaluated by Python; a bad
one refused with its position), and how a run treats a step whose condition is false, and
the steps that depend on a skipped one (docs/graphs.md, "Conditions")."""

from __future__ import annotations

from typing import Any

import pytest
from domain_harness import INPUT, Harness

from runcontrol.domain import RunState, StepState, WorkflowDefinition, errors
from runcontrol.domain.conditions import holds, parse, result_names

RESULTS = {"plan": {"risk": 3, "ok": True, "name": "x", "tags": []}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('input.repository == "ConnectSoft.CaseManagement"', True),
        ('input.revision != "a1b2c3d"', False),
        ("results.plan.risk >= 3 && results.plan.ok", True),
        ("results.plan.risk < 3 || !results.plan.ok", False),
        ("!(results.plan.risk > 5)", True),
        ("results.plan.missing == null", True),  # a path the data lacks is null
        ("results.plan.missing", False),
        ("results.plan.tags", False),  # empty: false
        ("results.plan.ok == 1", False),  # JSON's types: true is not 1
        ('results.plan.risk > "2"', False),  # a number and a string do not order
        ('results.plan.name < "y"', True),
        ("results.nothing.at.all", False),
        ("true && 2.5 > 1e0", True),
        ("input['repository'] == 'ConnectSoft.CaseManagement'", True),
    ],
)
def test_a_condition_is_read_off_the_input_and_the_results(text: str, expected: bool) -> None:
    assert holds(parse(text), INPUT, RESULTS) is expected


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("input.x ==", 10),
        ("input.x = 1", 8),
        ("(input.x", 8),
        ("secrets.token", 0),
        ("input", 5),
        ("input.x && ", 11),
        ('input.x == "open', 16),  # where the string ends unterminated
        ("__import__('os')", 0),
        ("1.2.3", 0),
    ],
)
def test_a_bad_condition_names_its_position(text: str, position: int) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        parse(text)
    assert refused.value.details["position"] == position
    assert refused.value.details["expression"] == text


def test_the_results_a_condition_reads_are_named() -> None:
    assert result_names(parse("results.a.x == 1 || !results.b && input.c")) == {"a", "b"}


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "b", "when": "results.c.ok"}, "not one of its dependencies"),
        ({"name": "b", "when": ""}, "a condition is a non-empty string"),
        ({"name": "b", "when": 3}, "a condition is a non-empty string"),
        ({"name": "b", "when": "input." + "x" * 600}, "at most 500 characters"),
    ],
)
def test_publication_refuses_what_a_condition_cannot_read(
    step: dict[str, Any], message: str
) -> None:
    steps = [{"name": "a", "agentId": "x"}, dict(step, agentId="x"), {"name": "c", "agentId": "x"}]
    with pytest.raises(errors.ValidationFailed, match=message):
        WorkflowDefinition.from_dict({"workflowId": "w", "steps": steps})


def test_a_condition_is_kept_in_the_release_and_the_step() -> None:
    h = Harness([{"name": "a", "agentId": "x", "when": "input.revision == 'a1b2c3d'"}])
    assert h.run.input is None  # (the harness's runs have no input unless given)
    assert h.release.definition.to_dict()["steps"][0]["when"] == "input.revision == 'a1b2c3d'"
    assert h.step(0).condition == "input.revision == 'a1b2c3d'"
    plain = Harness([{"name": "a", "agentId": "x"}])
    assert "when" not in plain.release.definition.to_dict()["steps"][0]  # its hash as before


def test_a_false_condition_skips_the_step_and_a_true_one_runs_it() -> None:
    h = Harness(
        [
            {"name": "skip", "agentId": "x", "when": "input.revision == 'other'", "dependsOn": []},
            {"name": "run", "agentId": "x", "when": "input.revision == 'a1b2c3d'", "dependsOn": []},
        ],
        run_input=INPUT,
    )
    h.start_ready()
    assert h.step(0).state is StepState.SKIPPED
    assert h.step(1).state is StepState.RUNNING
    assert "StepSkipped" in h.event_types()
    assert [j.cause for j in h.journal if j.to_state == "Skipped"] == ["ConditionFalse"]


def test_a_skip_propagates_down_its_branch_and_a_join_runs_with_what_ran() -> None:
    h = Harness(
        [
            {"name": "plan", "agentId": "x"},
            {"name": "fix", "agentId": "x", "when": "results.plan.broken", "dependsOn": ["plan"]},
            {"name": "verify", "agentId": "x", "dependsOn": ["fix"]},  # only after fix: skipped
            {"name": "report", "agentId": "x", "dependsOn": ["plan", "verify"]},  # the join: runs
        ]
    )
    _, grant = h.start()
    h.report(grant)  # plan succeeds without a result: results.plan.broken is null
    h.start_ready()
    states = [s.state for s in h.agg.steps]
    assert states == [StepState.SUCCEEDED, StepState.SKIPPED, StepState.SKIPPED, StepState.RUNNING]
    causes = [j.cause for j in h.journal if j.to_state == "Skipped"]
    assert causes == ["ConditionFalse", "DependenciesSkipped"]
    assert h.agg.dependency_results(h.step(3)) == {}  # a skipped step has no result


def test_a_run_whose_last_steps_are_skipped_completes_without_a_result() -> None:
    h = Harness([{"name": "only", "agentId": "x", "when": "input.never"}])
    h.start_ready()
    assert h.run.state is RunState.COMPLETED
    assert h.run.result_hash is None
    assert [j.cause for j in h.journal if j.entity == "Run"][-2:] == [
        "FirstAttemptDispatched",
        "LastStepSucceeded",
    ]
