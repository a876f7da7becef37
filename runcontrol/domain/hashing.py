"""Canonical JSON and the hashes built on it.

``canonical_json`` is RFC 8785-like: object keys sorted by code point, no insignificant
whitespace, UTF-8 without escaping non-ASCII, integers as integers, finite floats in their
shortest round-trip form (an integral float is written as an integer, so ``12`` and ``12.0``
hash alike), and NaN/Infinity rejected. A hash is ``"sha256:" + hex(sha256(canonical_json))``.
``inputHash``, ``proposalHash`` and ``outcomeHash`` all use it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from .errors import ValidationFailed

HASH_PREFIX = "sha256:"


# Where a value is inside the one being made canonical: None (the top), or (where its
# container is, its key or index). Its text (``a.b[0]``) is made only for a refusal: every
# result, input and fingerprint is made canonical, and each key's path text cost as much as
# the rest of the walk (issue 42).
Where = tuple[Any, str | int] | None


def _path(where: Where) -> str:
    parts: list[str | int] = []
    while where is not None:
        where, part = where
        parts.append(part)
    path = ""
    for part in reversed(parts):
        if isinstance(part, int):
            path = f"{path}[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path or "value"


def _normalise(value: Any, where: Where) -> Any:
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:  # the most, by their type
        return value
    if kind is dict:
        return _object(value, where)
    if kind is list:
        return [_normalise(item, (where, i)) for i, item in enumerate(value)]
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationFailed(f"{_path(where)}: NaN and Infinity have no canonical form")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, dict):
        return _object(value, where)
    if isinstance(value, list | tuple):
        return [_normalise(item, (where, i)) for i, item in enumerate(value)]
    raise ValidationFailed(f"{_path(where)}: {type(value).__name__} is not JSON")


def _object(value: dict[Any, Any], where: Where) -> dict[str, Any]:
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ValidationFailed(f"{_path(where)}: object keys must be strings")
        out[key] = _normalise(item, (where, key))
    return out


def canonical_json(value: Any) -> bytes:
    text = json.dumps(
        _normalise(value, None),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (json.loads turns "\ud800" into one) has no UTF-8 form.
        raise ValidationFailed("value: strings must be valid Unicode (lone surrogate)") from None


def canonical_hash(value: Any) -> str:
    return HASH_PREFIX + hashlib.sha256(canonical_json(value)).hexdigest()


_HEX_DIGITS = frozenset("0123456789abcdef")


def is_hash(value: str) -> bool:
    digest = value.removeprefix(HASH_PREFIX)
    return value.startswith(HASH_PREFIX) and len(digest) == 64 and _HEX_DIGITS.issuperset(digest)


def result_hash(canonical: str) -> str:
    """``canonical_hash`` of a value already held as its canonical JSON text."""
    return HASH_PREFIX + hashlib.sha256(canonical.encode("utf-8")).hexdigest()
