"""The words ``tables.py`` declares the schema in.

A column is declared by what it holds (``uid``, ``txt``, ``tz``, ``jsonb``, ``big``, ...):
``txt("name", "skill_id?")`` is two text columns, ``name`` NOT NULL and ``skill_id`` nullable (its
name ends in ``?``); ``ref("run_id")`` is a run's id and a foreign key to it. A tenant's table is
a ``tenant_table``: it gets its ``tenant_id`` here, and the row-level-security policies it is
marked with (``rls.py`` renders them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, JSONB, UUID
from sqlalchemy.schema import SchemaItem

from .rls import POLICIES, TENANT_ISOLATION, Policy

metadata = MetaData()  # the schema: every table of tables.py

TZ = DateTime(timezone=True)
# Invariant 2: what a run is pinned to at acceptance never changes. The run's writer leaves these
# columns out of its UPDATE and a trigger refuses a change (both rendered by ``writers.py``).
PIN = {"pinned": True}

Columns = tuple[Column[Any], ...]


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of column: ``kind("a", "b?")`` is its columns ``a`` (NOT NULL) and ``b`` (nullable:
    the name ends in ``?``); ``refs`` a foreign key to that column, the rest goes to ``Column``."""

    type: Callable[[], Any]  # a new instance for each column, as ``Column(name, Text)`` makes

    def __call__(self, *names: str, refs: str | None = None, **kw: Any) -> Columns:
        return tuple(self.column(name, refs, **kw) for name in names)

    def column(self, name: str, refs: str | None, **kw: Any) -> Column[Any]:
        if not (name.endswith("?") or kw.get("primary_key")):
            kw["nullable"] = False
        keys = [ForeignKey(refs)] if refs else []
        return Column(name.removesuffix("?"), self.type(), *keys, **kw)


uid = Kind(lambda: UUID(as_uuid=True))  # an id (the row's own, or another row's)
txt = Kind(Text)  # names, states, hashes, canonical JSON text
tz = Kind(lambda: TZ)  # a moment
jsonb = Kind(JSONB)  # a document
big = Kind(BigInteger)  # a count, a sequence number, a size in bytes
num = Kind(Integer)  # a small number: an ordinal, a limit, a priority
usd = Kind(Numeric)  # an amount of money
flag = Kind(Boolean)
real = Kind(DOUBLE_PRECISION)
texts = Kind(lambda: ARRAY(Text))
bigints = Kind(lambda: ARRAY(BigInteger))  # row ids, in an order


# What a column named for another row's key refers to (``ref``).
KEYS = {"run_id": "runs", "step_id": "steps", "attempt_id": "attempts"}


def ref(*names: str, **kw: Any) -> Columns:
    """Ids of other rows, each a foreign key to the table ``KEYS`` says its name is the key of."""
    return tuple(c for n in names for c in uid(n, refs=f"{KEYS[n]}.{n}", **kw))


def serial(name: str) -> Columns:
    """The row's key, numbered by the database."""
    return big(name, primary_key=True, autoincrement=True)


def index_where(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    """A partial index: of the rows ``where`` holds for."""
    return Index(name, *columns, unique=unique, postgresql_where=text(where))


def cascade(name: str, column: str, refs: str) -> ForeignKeyConstraint:
    """A foreign key whose rows go with the row they refer to."""
    return ForeignKeyConstraint([column], [refs], name=name, ondelete="CASCADE")


def length_check(table: str, column: str, limit: int) -> CheckConstraint:
    """The database's side of a limit publication checks (``domain/limits.py``, migration
    0025): ``column`` holds 1 to ``limit`` characters."""
    return CheckConstraint(
        f"char_length({column}) BETWEEN 1 AND {limit}", name=f"ck_{table}_{column}"
    )


def tenant_table(
    name: str,
    *items: SchemaItem | Columns,
    tenant_after: str | None = None,
    policies: tuple[Policy, ...] = (),
) -> Table:
    """A tenant's table (invariant 9): its ``tenant_id`` follows the columns marked primary key
    (first without any), or ``tenant_after``; its policies are the tenant's and ``policies``."""
    flat = [x for item in items for x in (item if isinstance(item, tuple) else (item,))]
    if tenant_after is not None:
        named = (i for i, x in enumerate(flat) if isinstance(x, Column) and x.name == tenant_after)
        at = next(named) + 1
    else:
        keys = (i for i, x in enumerate(flat) if not getattr(x, "primary_key", False))
        at = next(keys, len(flat))
    flat.insert(at, txt("tenant_id")[0])
    return Table(name, metadata, *flat, info={POLICIES: (TENANT_ISOLATION, *policies)})
