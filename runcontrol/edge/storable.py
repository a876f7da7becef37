"""What the store can hold: the bounds outside input is checked against, at both doors.

Text with a NUL character or a lone surrogate cannot be stored (PostgreSQL refuses both in
``text`` and ``jsonb``), numbers have a column's range, documents a depth. Input beyond them
is the sender's error at the edge (422 / ``INVALID_ARGUMENT``), never a database error later.
The limits themselves are stated in ``domain.limits``.
"""

from __future__ import annotations

import re
from typing import Any

from ..domain.limits import MAX_DEPTH

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: str) -> str:
    """``value`` if the store can hold it; else ``ValueError``."""
    if UNSTORABLE.search(value):
        raise ValueError("must not contain NUL characters or lone surrogates")
    return value


def storable_json(value: Any) -> Any:
    """``value`` if the store can hold it (no NUL, no lone surrogate, at most ``MAX_DEPTH``
    levels); else ``ValueError``."""
    _check(value, 0)
    return value


def _check(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"must not nest deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        storable(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            storable(key)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)
