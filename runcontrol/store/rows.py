"""Mapping between table rows and domain objects (the only place that knows both).

One generic mapper per (entity, table) pair, derived from the entity's dataclass fields and the
table's columns: a column is the field of the same name, unless the entity keeps it inside a
value object (``Run.release`` -> release_id, release_hash) or does not hold it at all (the
caller supplies it, or the database assigns it). Each pair is checked when this module loads:
a field with no column, or a column nobody fills, is an error here rather than a value silently
lost between a commit and the next load.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any, TypeVar

from sqlalchemy import Row, Table

from ..domain import model
from . import tables

T = TypeVar("T")
# A row as SQLAlchemy returns it, or as psycopg's ``dict_row`` does (the grains' store).
RowLike = Row[Any] | Mapping[str, Any]
Decode = Callable[[Any], Any]


def _decoder(hint: Any) -> Decode | None:
    """How a non-NULL column value becomes the field's type, or None when it already is it:
    enums from their value, floats from NUMERIC (a Decimal)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else None
    if isinstance(hint, type) and (issubclass(hint, Enum) or hint is float):
        decode: Decode = hint
        return decode
    return None


# Types an enum may derive from (``StrEnum`` is a ``str``): a field of one of these, or of an
# enum, may hold an enum; a field of any other type (a UUID, a datetime, a dict) never does.
_ENUM_BASES: frozenset[Any] = frozenset({str, int, float, Any, object})
_PLAIN: frozenset[type[Any]] = frozenset({str, int, float, bool, type(None)})  # never an enum


def _may_hold_enum(hint: Any) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_may_hold_enum(a) for a in typing.get_args(hint))
    return hint in _ENUM_BASES or (isinstance(hint, type) and issubclass(hint, Enum))


class _Mapper:
    """Rows of ``table`` <-> instances of ``cls``: a column is the field of the same name.

    ``nested``: field -> the columns of its value object, in the value class's field order.
    ``supplied``: columns the entity does not hold; ``to_row`` writes them only when the caller
    gives them (``Run``'s next_due_at is added by the unit of work). ``generated``: columns the
    database assigns (serial ids), never written.
    """

    def __init__(
        self,
        cls: type[Any],
        table: Table,
        *,
        nested: Mapping[str, tuple[str, ...]] | None = None,
        supplied: tuple[str, ...] = (),
        generated: tuple[str, ...] = (),
    ) -> None:
        nested = nested or {}
        self.cls = cls
        self.table = table
        self.supplied = frozenset(supplied)
        paths: dict[str, str] = {}  # column -> the attribute holding it ("release.hash")
        hints: dict[str, Any] = {}  # column -> the type of that attribute
        self._nested: list[tuple[str, type[Any], tuple[str, ...]]] = []
        for f, hint in _fields(cls):
            if f in nested:
                parts, cols = _fields(hint), nested[f]
                if len(parts) != len(cols):
                    raise TypeError(f"{cls.__name__}.{f}: {len(parts)} parts, columns {cols}")
                for (part, part_hint), col in zip(parts, cols, strict=True):
                    _claim(paths, col, f"{f}.{part}")
                    hints[col] = part_hint
                self._nested.append((f, hint, cols))
            else:
                _claim(paths, f, f)
                hints[f] = hint
        # plain str: Column.name is a str subclass, which orjson refuses as a dict key
        columns = [str(c.name) for c in table.columns]
        unknown = set(paths) - set(columns)
        unfilled = set(columns) - set(paths) - self.supplied - set(generated)
        if unknown or unfilled:
            raise TypeError(
                f"{cls.__name__} <-> {table.name}: fields without a column {sorted(unknown)}, "
                f"columns without a field {sorted(unfilled)}"
            )
        self._columns = tuple(c for c in columns if c in paths)  # in the table's order
        self._get = operator.attrgetter(*(paths[c] for c in self._columns))
        self._decoders = tuple(
            (c, d) for c in self._columns if (d := _decoder(hints[c])) is not None
        )
        # the columns whose field may hold an enum (stored by its value): the others are
        # written as they are, unchecked (a third of a run's row; issue 33)
        enums = {c for c in self._columns if _may_hold_enum(hints[c])}
        self._spec = [(c, paths[c], c in enums) for c in self._columns]
        self._render = _renderer(cls, self._spec)

    def renderer_without(self, *left_out: str) -> Callable[[Any], dict[str, Any]]:
        """``to_row`` without the columns ``left_out`` (made once: never rendered)."""
        return _renderer(self.cls, [s for s in self._spec if s[0] not in left_out])

    def to_row(self, entity: Any, **supplied: Any) -> dict[str, Any]:
        row = self._render(entity)
        if supplied:
            if not supplied.keys() <= self.supplied:
                raise TypeError(f"{self.table.name} takes no supplied column {sorted(supplied)}")
            row.update(supplied)
        return row

    def from_row(self, row: RowLike) -> Any:
        m = row._mapping if isinstance(row, Row) else row
        values = {c: m[c] for c in self._columns}
        for c, decode in self._decoders:
            if values[c] is not None:
                values[c] = decode(values[c])
        for f, value_cls, cols in self._nested:
            values[f] = value_cls(*(values.pop(c) for c in cols))
        return self.cls(**values)


def _renderer(
    cls: type[Any], columns: list[tuple[str, str, bool]]
) -> Callable[[Any], dict[str, Any]]:
    """The function making ``cls``'s row: one dict display reading each column's attribute,
    an enum stored by its value (checked only where the field may hold one, the cheaper type
    test first). Compiled once per mapper from the checked column names: a row is made on
    every commit of every entity it writes (issue 42)."""
    lines, items = [], []
    for i, (column, path, may_be_enum) in enumerate(columns):
        if not column.isidentifier() or not all(p.isidentifier() for p in path.split(".")):
            raise TypeError(f"{cls.__name__}: column {column!r} ({path}) is not a name")
        if may_be_enum:
            lines.append(f"    v{i} = e.{path}")
            lines.append(f"    if type(v{i}) not in plain and isinstance(v{i}, Enum):")
            lines.append(f"        v{i} = v{i}.value")
            items.append(f"{column!r}: v{i}")
        else:
            items.append(f"{column!r}: e.{path}")
    source = "\n".join(["def render(e):", *lines, f"    return {{{', '.join(items)}}}"])
    namespace: dict[str, Any] = {"plain": _PLAIN, "Enum": Enum}
    exec(compile(source, f"<row of {cls.__name__}>", "exec"), namespace)  # noqa: S102
    render: Callable[[Any], dict[str, Any]] = namespace["render"]
    return render


def _claim(paths: dict[str, str], column: str, path: str) -> None:
    if column in paths:
        raise TypeError(f"column {column} is both {paths[column]} and {path}")
    paths[column] = path


def _fields(cls: type[Any]) -> list[tuple[str, Any]]:
    """The stored fields of ``cls`` (``Event.body`` is memory only: its ``payload`` is stored)."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata.get("stored", True)
    ]


MAPPERS: dict[type[Any], _Mapper] = {
    m.cls: m
    for m in (
        _Mapper(
            model.Run,
            tables.runs,
            nested={
                "release": ("release_id", "release_hash"),
                "policy": ("policy_id", "policy_revision"),
                "limits": ("max_cost_usd", "max_minutes"),
            },
            supplied=("next_due_at",),
        ),
        _Mapper(model.Step, tables.steps),
        # the step's agent, for claims
        _Mapper(model.Attempt, tables.attempts, supplied=("agent_id",)),
        _Mapper(model.AttemptResult, tables.attempt_results),
        _Mapper(model.JournaledCall, tables.journaled_calls),
        _Mapper(model.Lease, tables.leases),
        _Mapper(model.ApprovalRequest, tables.approval_requests),
        _Mapper(model.ApprovalDecision, tables.approval_decisions),
        _Mapper(model.CancellationIntent, tables.cancellation_intents),
        _Mapper(model.ToolCall, tables.tool_calls),
        # the journal entries its document recorded, on its last event (0033: ``journal_entries``);
        # its publication the relay's
        _Mapper(
            model.Event,
            tables.outbox,
            supplied=("journal",),
            generated=("id", "published_at", "feed_position"),
        ),
        _Mapper(model.RecoveryJournalEntry, tables.recovery_journal, generated=("id",)),
        _Mapper(model.AuditRecord, tables.audit_log, generated=("id",)),
    )
}


_JOURNAL_ENTRY = MAPPERS[model.RecoveryJournalEntry].renderer_without("tenant_id", "run_id")


def journal_entries(entries: Iterable[model.RecoveryJournalEntry]) -> list[dict[str, Any]]:
    """The journal entries as an event row carries them (``outbox.journal``, 0033): each the
    journal view's row without what the event row holds (its tenant and run)."""
    return [_JOURNAL_ENTRY(entry) for entry in entries]


def to_row(entity: Any, **supplied: Any) -> dict[str, Any]:
    """The row (column -> value) that stores ``entity``, plus any ``supplied`` columns."""
    return MAPPERS[type(entity)].to_row(entity, **supplied)


def from_row(cls: type[T], row: RowLike) -> T:
    result: T = MAPPERS[cls].from_row(row)
    return result
