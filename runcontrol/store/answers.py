"""Command answers as JSON (``command_answers.answer``), and back.

An answer is stored as ``{"type": <class name or null>, "value": ...}``: orjson writes the
dataclass (UUIDs, datetimes and enums as strings); reading it back rebuilds the dataclass from
its field types. Only the declared commands' answer types (``commands.DECLARATIONS``) are ever
stored; anything else is a plain JSON value.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime
from enum import Enum
from typing import Any
from uuid import UUID

from ..commands import DECLARATIONS


def _answer_types() -> dict[str, type[Any]]:
    """The dataclasses the declared commands answer (``Command[R]``; ``R | None`` too), by
    name: the stored ``type``."""
    found: dict[str, type[Any]] = {}
    for declared in DECLARATIONS.values():
        answers = declared.answers
        if typing.get_origin(answers) in (typing.Union, types.UnionType):
            answers = next(a for a in typing.get_args(answers) if a is not type(None))
        if dataclasses.is_dataclass(answers) and isinstance(answers, type):
            if found.setdefault(answers.__name__, answers) is not answers:
                raise TypeError(f"two answer types are named {answers.__name__}")
    return found


ANSWER_TYPES: dict[str, type[Any]] = _answer_types()


def encode(value: Any) -> dict[str, Any]:
    """The stored form of an answer (orjson serialises the dataclass inside)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if ANSWER_TYPES.get(name) is not type(value):
            raise TypeError(f"{name} is not a storable answer type")
        return {"type": name, "value": value}
    return {"type": None, "value": value}


def decode(stored: dict[str, Any]) -> Any:
    name = stored.get("type")
    if name is None:
        return stored.get("value")
    cls = ANSWER_TYPES[name]
    hints = _hints(cls)
    data = stored["value"]
    # A field added after the answer was stored keeps its default (an answer stored before
    # Attempt.progress_seq, inside the resend window of an upgrade).
    return cls(
        **{
            f.name: _coerce(hints[f.name], data[f.name])
            for f in dataclasses.fields(cls)
            if f.name in data
        }
    )


_HINTS: dict[str, dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls.__name__)
    if hints is None:
        hints = _HINTS[cls.__name__] = typing.get_type_hints(cls)
    return hints


def _coerce(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _coerce(inner, value)
    if hint is UUID:
        return UUID(value)
    if hint is datetime:
        return datetime.fromisoformat(value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return value
