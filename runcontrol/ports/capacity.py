"""Execution capacity (BC-26): may another attempt be dispatched now?

The cap is checked by the statement that dispatches (migration 0007: the tenant's open attempts,
counted under a per-tenant lock, this dispatch included), so the port is only the terms; a
capacity service elsewhere would make it a call again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capacity:
    """The cap every tenant's dispatches are checked against."""

    # The most non-terminal (Dispatched or Leased) attempts a tenant may have (None: no cap).
    max_open_attempts_per_tenant: int | None = None
