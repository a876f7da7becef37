"""What the store can hold: the bounds outside input is checked against, at both doors.

Text with a NUL character or a lone surrogate cannot be stored (PostgreSQL refuses both in
``text`` and ``jsonb``), numbers have a column's range, documents a depth. Input beyond them
is the sender's error at the edge (422 / ``INVALID_ARGUMENT``), never a database error later.
The HTTP models (``schemas.api``) and the outside commands' builders (``edge.commands``) take
their bounds from here.
"""

from __future__ import annotations

import re
from typing import Any

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_DEPTH = 32  # how deep a JSON document may nest
MAX_NAME = 200  # an id or a name (a workflow, a release, a signal ...)
MAX_REASON = 2000  # a reason, a description
MAX_BIGINT = 2**63 - 1  # a version, a sequence number, a feed position (int8)
MAX_MINUTES = 10 * 366 * 24 * 60  # ten years: keeps deadlines and the int4 column in range
MAX_COST_USD = 1e12


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
