"""A workflow exposed as an A2A agent (issue 31): what its release opts into, and how a
message's parts become a run's input.

The ``agent`` block of a workflow definition is opt-in: without it the workflow is no agent
(its card is a 404) and the definition's content hash is what it was. Its checks run at
publication, with the rest of the definition: a block the agent door could not serve is
refused before anything is published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import json_schema
from .errors import ValidationFailed

MAX_TEXT = 200  # a name, an id, a tag, a key
MAX_DESCRIPTION = 2000
MAX_SKILLS = 20
MERGE = "merge"  # the data part's object is the input's top level


@dataclass(frozen=True, slots=True)
class AgentSkill:
    skill_id: str
    name: str
    description: str
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.skill_id,
            "name": self.name,
            "description": self.description,
            "tags": list(self.tags),
            "examples": list(self.examples),
        }


@dataclass(frozen=True, slots=True)
class InputMapping:
    """How a message's parts become the run's input: the text parts, joined by a newline,
    go under ``text`` (None: a text part is refused); a data part (a JSON object) is the
    input's top level (``data`` = ``merge``) or goes under the key ``data`` (None: refused).
    Each key in ``required`` must be in the input that results."""

    text: str | None = "text"
    data: str | None = MERGE
    required: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "data": self.data, "required": list(self.required)}


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class DataPart:
    data: Any


Part = TextPart | DataPart


@dataclass(frozen=True, slots=True)
class AgentExposure:
    """What a release says of the workflow as an agent: its card's name, description and
    skills, the input mapping, and the model profile a submission through A2A pins. The
    workflow's newest release decides: the agent is that release (a submission pins it by
    id), and a newest release without the block makes the workflow no agent."""

    name: str
    description: str
    skills: tuple[AgentSkill, ...]
    input: InputMapping = InputMapping()
    model_profile_id: str = "default"
    # The run input's JSON Schema (``domain.json_schema``'s subset): an MCP client's tool
    # input schema, and a check of every input submitted through the agent doors. None: the
    # schema the input mapping implies (``tool_schema``), nothing checked beyond it.
    input_schema: Mapping[str, Any] | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> AgentExposure:
        if not isinstance(raw, Mapping):
            raise ValidationFailed("agent must be an object", field="agent")
        skills_raw = raw.get("skills") or []
        if not isinstance(skills_raw, list) or not 1 <= len(skills_raw) <= MAX_SKILLS:
            raise ValidationFailed(
                f"agent.skills must list 1 to {MAX_SKILLS} skills", field="agent.skills"
            )
        skills = tuple(_skill(i, s) for i, s in enumerate(skills_raw))
        if len({s.skill_id for s in skills}) != len(skills):
            raise ValidationFailed("agent.skills: ids must be unique", field="agent.skills")
        return cls(
            name=_text(raw.get("name"), "agent.name"),
            description=_text(raw.get("description"), "agent.description", MAX_DESCRIPTION),
            skills=skills,
            input=_mapping(raw.get("input")),
            model_profile_id=_text(raw.get("modelProfileId", "default"), "agent.modelProfileId"),
            input_schema=_input_schema(raw.get("inputSchema")),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "description": self.description,
            "skills": [s.to_dict() for s in self.skills],
            "input": self.input.to_dict(),
            "modelProfileId": self.model_profile_id,
        }
        if self.input_schema is not None:  # absent: a block without one hashes as before
            out["inputSchema"] = dict(self.input_schema)
        return out

    def tool_schema(self) -> dict[str, Any]:
        """The run input's JSON Schema: the block's ``inputSchema``, else an object with the
        input mapping's ``text`` key (a string) and its ``required`` keys."""
        if self.input_schema is not None:
            return {"type": "object", **self.input_schema}
        properties = {} if self.input.text is None else {self.input.text: {"type": "string"}}
        return {"type": "object", "properties": properties, "required": list(self.input.required)}

    def checked(self, run_input: dict[str, Any]) -> dict[str, Any]:
        """``run_input`` if it holds the block's ``inputSchema`` and ``required`` keys, else
        ``ValidationFailed`` naming the rule it breaks (nothing is submitted then)."""
        missing = [k for k in self.input.required if k not in run_input]
        if missing:
            raise ValidationFailed(f"the input lacks {missing} (the agent's required input)")
        if self.input_schema is not None:
            error = json_schema.first_error(self.input_schema, run_input, "input")
            if error:
                raise ValidationFailed(f"the agent's input schema: {error}")
        return run_input

    def run_input(self, parts: Sequence[Part]) -> dict[str, Any]:
        """The run's input made of a message's parts, or ``ValidationFailed`` saying which
        part or key is wrong (nothing is submitted then)."""
        mapping = self.input
        out: dict[str, Any] = {}
        texts: list[str] = []
        for i, part in enumerate(parts):
            if isinstance(part, TextPart):
                if mapping.text is None:
                    raise ValidationFailed(f"parts[{i}]: this agent takes no text part")
                texts.append(part.text)
            elif mapping.data is None:
                raise ValidationFailed(f"parts[{i}]: this agent takes no data part")
            elif mapping.data == MERGE:
                if not isinstance(part.data, dict):
                    raise ValidationFailed(f"parts[{i}]: the data part must be a JSON object")
                out.update(part.data)
            else:
                out[mapping.data] = part.data
        if texts and mapping.text is not None:
            out[mapping.text] = "\n".join(texts)
        return self.checked(out)


def _text(value: Any, field: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
        raise ValidationFailed(f"{field} must be text of 1 to {limit} characters", field=field)
    return value


def _texts(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_SKILLS:
        raise ValidationFailed(f"{field} must be a list of at most {MAX_SKILLS}", field=field)
    return tuple(_text(v, f"{field}[{i}]", MAX_DESCRIPTION) for i, v in enumerate(value))


def _skill(i: int, raw: Any) -> AgentSkill:
    field = f"agent.skills[{i}]"
    if not isinstance(raw, Mapping):
        raise ValidationFailed(f"{field} must be an object", field=field)
    return AgentSkill(
        skill_id=_text(raw.get("id"), f"{field}.id"),
        name=_text(raw.get("name"), f"{field}.name"),
        description=_text(raw.get("description"), f"{field}.description", MAX_DESCRIPTION),
        tags=_texts(raw.get("tags"), f"{field}.tags"),
        examples=_texts(raw.get("examples"), f"{field}.examples"),
    )


def _input_schema(raw: Any) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or raw.get("type", "object") != "object":
        raise ValidationFailed(
            "agent.inputSchema must be a JSON Schema of an object", field="agent.inputSchema"
        )
    json_schema.check_schema(raw, "agent.inputSchema")
    return raw


def _mapping(raw: Any) -> InputMapping:
    if raw is None:
        return InputMapping()
    if not isinstance(raw, Mapping):
        raise ValidationFailed("agent.input must be an object", field="agent.input")
    text, data = raw.get("text", "text"), raw.get("data", MERGE)
    text = None if text is None else _text(text, "agent.input.text")
    data = None if data is None else _text(data, "agent.input.data")
    if text is None and data is None:
        raise ValidationFailed("agent.input must take text or data", field="agent.input")
    required = raw.get("required") or []
    if not isinstance(required, list):
        raise ValidationFailed("agent.input.required must be a list", field="agent.input")
    return InputMapping(
        text=text,
        data=data,
        required=tuple(_text(k, "agent.input.required") for k in required),
    )
