"""A workflow exposed as an A2A agent (``domain.agent``): the release's opt-in block, checked
at publication, and how a message's parts become the run's input."""

from __future__ import annotations

from typing import Any

import pytest

from runcontrol.domain import WorkflowDefinition
from runcontrol.domain.agent import AgentExposure, DataPart, TextPart
from runcontrol.domain.errors import ValidationFailed

STEPS = [{"name": "only", "agentId": "a"}]


def block(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "Agent",
        "description": "Does it.",
        "skills": [{"id": "s", "name": "S", "description": "One skill.", "tags": ["x"]}],
    }
    raw.update(overrides)
    return raw


def test_without_the_block_a_workflow_is_no_agent_and_keeps_its_content_hash() -> None:
    plain = WorkflowDefinition.from_dict({"workflowId": "w", "steps": STEPS})
    assert plain.agent is None and "agent" not in plain.to_dict()
    exposed = WorkflowDefinition.from_dict({"workflowId": "w", "steps": STEPS, "agent": block()})
    assert exposed.agent is not None
    assert WorkflowDefinition.from_dict(exposed.to_dict()) == exposed
    assert exposed.content_hash != plain.content_hash


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        block(skills=[]),
        block(name=""),
        block(skills=[{"id": "s", "name": "S"}]),  # no description
        block(skills=[block()["skills"][0], block()["skills"][0]]),  # duplicate ids
        block(input={"text": None, "data": None}),
        block(input={"required": "question"}),
        block(description="x" * 2001),
        block(inputSchema={"type": "array"}),  # a run's input is an object
        block(inputSchema={"properties": {"a": {"$ref": "#/x"}}}),  # outside the subset
        block(inputSchema=[]),
    ],
)
def test_a_block_the_agent_door_could_not_serve_is_refused_at_publication(bad: Any) -> None:
    with pytest.raises(ValidationFailed):
        WorkflowDefinition.from_dict({"workflowId": "w", "steps": STEPS, "agent": bad})


def test_text_parts_join_under_their_key_and_a_data_object_merges() -> None:
    agent = AgentExposure.from_dict(block(input={"text": "q", "data": "merge"}))
    parts = [TextPart("a"), DataPart({"n": 1}), TextPart("b")]
    assert agent.run_input(parts) == {"q": "a\nb", "n": 1}


def test_data_under_a_key_and_required_keys() -> None:
    agent = AgentExposure.from_dict(
        block(input={"text": None, "data": "payload", "required": ["payload"]})
    )
    assert agent.run_input([DataPart([1, 2])]) == {"payload": [1, 2]}
    with pytest.raises(ValidationFailed, match="payload"):
        agent.run_input([])
    with pytest.raises(ValidationFailed, match="no text part"):
        agent.run_input([TextPart("x")])


def test_merge_needs_an_object() -> None:
    agent = AgentExposure.from_dict(block())
    with pytest.raises(ValidationFailed, match="object"):
        agent.run_input([DataPart([1])])


def test_an_input_schema_is_the_tools_and_checks_every_input() -> None:
    """An MCP client sees it as the workflow tool's input schema (docs/mcp.md); A2A's input
    made of parts is checked against it too."""
    schema = {"properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    agent = AgentExposure.from_dict(block(inputSchema=schema))
    assert agent.tool_schema() == {"type": "object", **schema}
    assert agent.checked({"n": 2}) == {"n": 2}
    with pytest.raises(ValidationFailed, match="minimum"):
        agent.checked({"n": 0})
    with pytest.raises(ValidationFailed, match="'n' missing"):
        agent.run_input([DataPart({"m": 1})])
    exposed = WorkflowDefinition.from_dict(
        {"workflowId": "w", "steps": STEPS, "agent": block(inputSchema=schema)}
    )
    assert WorkflowDefinition.from_dict(exposed.to_dict()) == exposed
    # Without one: the input mapping's text key and required keys, and the hash as before.
    plain = AgentExposure.from_dict(block(input={"text": "q", "required": ["q"]}))
    assert plain.tool_schema() == {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    }
    assert "inputSchema" not in plain.to_dict()


def test_the_demo_workflow_of_make_run_is_an_agent() -> None:
    from runcontrol.cli.demo import DEMO_WORKFLOW

    agent = WorkflowDefinition.from_dict(DEMO_WORKFLOW).agent
    assert agent is not None and agent.model_profile_id == "code-agent"
    assert agent.run_input([TextPart("please")]) == {"request": "please"}
