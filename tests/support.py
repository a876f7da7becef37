"""Helpers shared by the test layers (importable because tests/ holds the root conftest)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

from sqlalchemy import select

from runcontrol.store import Database


def race(*calls: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run ``calls`` in threads released together by a barrier; return ("ok"|"err", value)."""
    barrier = threading.Barrier(len(calls))
    results: list[tuple[str, Any]] = [("missing", None)] * len(calls)

    def body(i: int, call: Callable[[], Any]) -> None:
        barrier.wait(timeout=10)
        try:
            results[i] = ("ok", call())
        except Exception as exc:  # handed to the test to assert on
            results[i] = ("err", exc)

    threads = [threading.Thread(target=body, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a racing command hung"
    return results


def run_rows(db: Database, tenant: str, table: Any, run_id: UUID, order: Any = None) -> list[Any]:
    """A run's rows of ``table`` as its tenant sees them (row-level security applies)."""
    stmt = select(table).where(table.c.run_id == run_id)
    if order is not None:
        stmt = stmt.order_by(order)
    with db.tenant(tenant) as conn:
        return list(conn.execute(stmt))
