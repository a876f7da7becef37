"""JSON text of the engine's documents: orjson's, and the standard library's for what orjson
cannot write (issue 34).

orjson refuses an integer beyond 64 bits (``TypeError: Integer exceeds 64-bit range``), and
such an integer is valid JSON a user may send in a run's input, a signal's body or progress
data (results already carry them, as canonical text). Those documents fall back to ``json``,
which writes every integer as its digits; PostgreSQL's ``jsonb`` holds it exactly and the
readers (``json.loads``) give the same integer back. Nothing else changes: every document
orjson can write is written by orjson, byte for byte as before.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import date
from typing import Any
from uuid import UUID

import orjson


def dumps(value: Any, default: Callable[[Any], Any], *, sort_keys: bool = False) -> bytes:
    """``value`` as JSON bytes; ``default`` as orjson's (a type neither writes natively)."""
    try:
        return orjson.dumps(value, default=default, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise

    def natively(item: Any) -> Any:  # what orjson writes itself, as it writes it
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
        if isinstance(item, UUID):
            return str(item)
        if isinstance(item, date):
            return item.isoformat()
        return default(item)

    text = json.dumps(
        value, default=natively, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False
    )
    return text.encode()
