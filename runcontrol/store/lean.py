"""Lean child rows (issue 42, point 2): a step, attempt or lease the store holds is sent as the
columns that changed, not whole.

As ``commit._STORED_RUN`` does for the run (issue 33), the rows of an aggregate's steps,
attempts and leases as the database holds them are kept per aggregate: as loaded, then as each
commit wrote them. ``split`` sends a changed row whose stored row is known as a patch (its key
and the columns that differ: ``<table>_patch``, applied by the generated
``runcontrol_patch_<table>``, which keeps every column a patch leaves out), a row not known
(new, or of an aggregate made some other way) whole, as before, and nothing for a row marked
changed that did not change. Weak: an aggregate the grain drops takes its rows with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from ..domain import RunAggregate

# The child tables sent lean, each with its key (what a patch names its row by).
KEYS = {"steps": "step_id", "attempts": "attempt_id", "leases": "lease_id"}

Rows = dict[Any, dict[str, Any]]  # a table's stored rows by key
_STORED: weakref.WeakKeyDictionary[RunAggregate, dict[str, Rows]] = weakref.WeakKeyDictionary()


def remember(agg: RunAggregate, written: Mapping[str, Iterable[dict[str, Any]]]) -> None:
    """``written`` (table -> rows, whole) is what the database holds of ``agg`` now: loaded, or
    committed."""
    stored = _STORED.setdefault(agg, {})
    for table, found in written.items():
        key, held = KEYS[table], stored.setdefault(table, {})
        for row in found:
            held[row[key]] = row


def split(
    agg: RunAggregate, table: str, found: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``found`` (whole rows of ``table``) as (rows sent whole, patches)."""
    held = _STORED.get(agg, {}).get(table)
    if not held:
        return found, []
    key = KEYS[table]
    whole: list[dict[str, Any]] = []
    patches: list[dict[str, Any]] = []
    for row in found:
        stored = held.get(row[key])
        if stored is None:
            whole.append(row)
            continue
        # the same object is the same value: a list or a dict the entity still holds (a
        # step's dependencies, its flow keys) is not compared item by item
        patch = {
            c: v
            for c, v in row.items()
            if c == key or ((s := stored.get(c, v)) is not v and s != v)
        }
        if len(patch) > 1:
            patches.append(patch)
    return whole, patches
