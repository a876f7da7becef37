"""The JSON Schema subset a template's constraints are written in (issue 44): checked once at
creation (an unknown keyword or a malformed value is a ``ValidationFailed``, a 422), then
applied to a submission's input or an approval's proposal. Pure: no library, no reference
resolution (``$ref`` is refused), so a constraint means the same in every release.

Keywords: ``type`` (a name or a list of names), ``properties``, ``required``,
``additionalProperties`` (a boolean or a schema), ``items``, ``enum``, ``const``,
``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``,
``maxLength``, ``pattern`` (searched, as JSON Schema says), ``minItems``, ``maxItems``, and the
annotations ``title``, ``description``, ``$schema``, ``$comment``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import ValidationFailed

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_ANNOTATIONS = ("title", "description", "$schema", "$comment")
KEYWORDS = frozenset(
    (
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "pattern",
        *_NUMBERS,
        *_COUNTS,
        *_ANNOTATIONS,
    )
)
MAX_DEPTH = 16


def check_schema(schema: Any, where: str) -> None:
    """Refuse a schema outside the subset, naming where (``where`` prefixes the message)."""
    _check(schema, where, 0)


def _check(schema: Any, where: str, depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise ValidationFailed(f"{where}: a schema is an object or a boolean")
    if depth > MAX_DEPTH:
        raise ValidationFailed(f"{where}: a schema nests at most {MAX_DEPTH} levels")
    unknown = sorted(set(schema) - KEYWORDS)
    if unknown:
        raise ValidationFailed(f"{where}: unsupported keyword {unknown[0]!r}")
    kind = schema.get("type")
    if kind is not None:
        names = kind if isinstance(kind, list) else [kind]
        if not names or any(n not in TYPES for n in names):
            raise ValidationFailed(f"{where}.type: one of {', '.join(TYPES)} (or a list)")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ValidationFailed(f"{where}.properties: an object of schemas")
    for name, sub in properties.items():
        _check(sub, f"{where}.properties.{name}", depth + 1)
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValidationFailed(f"{where}.required: a list of names")
    for key in ("additionalProperties", "items"):
        if key in schema:
            _check(schema[key], f"{where}.{key}", depth + 1)
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValidationFailed(f"{where}.enum: a list of values")
    for key in _NUMBERS:
        if key in schema and not _is_number(schema[key]):
            raise ValidationFailed(f"{where}.{key}: a number")
    for key in _COUNTS:
        if key in schema and not (_is_number(schema[key]) and int(schema[key]) >= 0):
            raise ValidationFailed(f"{where}.{key}: a non-negative integer")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError):
            raise ValidationFailed(f"{where}.pattern: a regular expression") from None


def first_error(schema: Any, value: Any, where: str) -> str | None:
    """The first rule ``value`` breaks (``where.path: keyword ...``), or None if it holds."""
    if schema is True:
        return None
    if schema is False:
        return f"{where}: nothing is allowed here"
    for keyword, holds in _RULES:
        if keyword in schema and not holds(schema[keyword], value):
            return f"{where}: {keyword} {schema[keyword]!r} not satisfied"
    if isinstance(value, Mapping):
        for name in schema.get("required", []):
            if name not in value:
                return f"{where}: required {name!r} missing"
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            sub = properties.get(name, extra)
            error = first_error(sub, item, f"{where}.{name}")
            if error:
                return error
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            error = first_error(schema["items"], item, f"{where}[{i}]")
            if error:
                return error
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    return {"object"} if isinstance(value, Mapping) else set()


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    return bool(a == b) and _kind(a) == _kind(b)


def _type(kind: Any, value: Any) -> bool:
    return bool(_kind(value) & set(kind if isinstance(kind, list) else [kind]))


_RULES: tuple[tuple[str, Any], ...] = (
    ("type", _type),
    ("enum", lambda options, v: any(_same(o, v) for o in options)),
    ("const", _same),
    ("minimum", lambda b, v: not _is_number(v) or v >= b),
    ("maximum", lambda b, v: not _is_number(v) or v <= b),
    ("exclusiveMinimum", lambda b, v: not _is_number(v) or v > b),
    ("exclusiveMaximum", lambda b, v: not _is_number(v) or v < b),
    ("minLength", lambda n, v: not isinstance(v, str) or len(v) >= n),
    ("maxLength", lambda n, v: not isinstance(v, str) or len(v) <= n),
    ("minItems", lambda n, v: not isinstance(v, list) or len(v) >= n),
    ("maxItems", lambda n, v: not isinstance(v, list) or len(v) <= n),
    ("pattern", lambda p, v: not isinstance(v, str) or re.search(p, v) is not None),
)
