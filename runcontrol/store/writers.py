"""The per-table SQL writers, rendered from ``tables.py``.

``runcontrol_apply_document`` (``store/sql/runcontrol_apply_document.sql``), which a group
commit runs per document, keeps by hand only what is not a table's column list (the version
guard, the budget reservation, the capacity check, the budget release, the notifications) and
hands each table's rows to that table's writer, rendered here:

- ``runcontrol_insert_runs(doc)`` / ``runcontrol_update_runs(doc, expected_version)``: the
  run's insert (a used idempotency key inserts nothing) and its version-guarded update, each
  answering whether it wrote the row. The update leaves out the columns ``tables.py`` marks
  pinned (invariant 2), and ``runcontrol_keep_run_pins`` (a trigger) refuses a change of one.
- ``runcontrol_patch_runs(doc, expected_version)`` (issue 33): the same guarded update
  of only the columns ``doc`` carries (the others keep their stored values: an unchanged
  ``input`` keeps its TOAST pointer instead of being written again).
- ``runcontrol_write_<table>(rows)``: an upsert on the primary key, or a plain insert for the
  tables the write path only adds to (``tables.INSERT_ONLY_TABLES``), answering whether it wrote.
- ``runcontrol_patch_<table>(rows)`` (issue 42) for ``PATCHED``: each row by its key, only the
  columns it carries (a step, attempt or lease the store holds is sent lean: ``lean.py``).
- ``runcontrol_append_<table>(docs, applied, key, tenant)`` (issue 33) for the tables a
  group commit appends to after its documents applied (``GROUP_APPENDED``): one insert of the
  rows under ``key`` of the documents of ``tenant`` at the places ``applied`` (from 1), in
  document order (a key holding one object is one row).

Every writer is static SQL in plpgsql: its plans are cached per session, as the old whole
function's were. Each answers a value so that ``runcontrol_apply_document`` calls it as an
expression (``wrote := ...``), which plpgsql evaluates as a simple expression, without the
executor start-up a ``PERFORM`` (a whole query) pays per call.

No migration copies a writer: like the hand-written functions of ``store/sql/``, each is
applied by name with its text of today (``store/functions.py``). ``make sql`` (``python -m
runcontrol.store.functions``) writes the revision that applies the writers (and functions) whose
text changed since the chain last recorded it, and ``tests/store/test_writers.py`` fails until
it has been run. Adding a stored column is therefore: the field, the ``Column``, ``make sql``,
and the ``ALTER`` in the revision it wrote, before its ``apply``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Column, MetaData, Table, UniqueConstraint
from sqlalchemy.dialects import postgresql

from .tables import INSERT_ONLY_TABLES, metadata

APP_ROLE = "runcontrol_app"
# The tables the write path writes, in the order a document writes them. The runs table is
# written by its own two functions; budget reservations by runcontrol_apply's own clauses.
WRITTEN = (
    "steps",
    "attempts",
    "attempt_results",
    "journaled_calls",
    "leases",
    "tool_calls",
    "approval_requests",
    "approval_decisions",
    "cancellation_intents",
    "outbox",  # each document's journal entries on its last event (0033)
    "audit_log",
    "command_answers",
)
# The append-only tables whose rows a group commit inserts for all its documents at once, once
# they have applied (runcontrol_apply_many): no document reads them.
GROUP_APPENDED = ("outbox", "audit_log", "command_answers", "attempt_results")
# The tables whose rows the store holds are sent as patches once stored (store/lean.py).
PATCHED = ("steps", "attempts", "leases")
_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]
RUN_IDEMPOTENCY = "uq_runs_idempotency"  # a second insert with the key inserts nothing
RUN_VERSION = "version"  # the optimistic-concurrency guard of the run's update


@dataclass(frozen=True, slots=True)
class Unit:
    """One rendered function (and the trigger that calls it, for the pins)."""

    name: str
    signature: str  # its argument types, as GRANT names them: "jsonb", "jsonb, bigint"
    sql: str  # the whole text, ending with its grants

    @property
    def body(self) -> str:
        """What ``pg_proc.prosrc`` holds for it: the text between the dollar quotes."""
        return self.sql.split("$fn$", 2)[1]


# ---------------------------------------------------------------------- rendering


def written_columns(table: Table) -> list[str]:
    """The columns a writer names: all but those the database assigns (serial ids)."""
    return [str(c.name) for c in table.columns if not _assigned(c)]


def _assigned(column: Column[object]) -> bool:
    return bool(column.primary_key and column.autoincrement is True)


def _primary_key(table: Table) -> list[str]:
    return [str(c.name) for c in table.primary_key.columns]


def _pinned(table: Table) -> list[str]:
    return [str(c.name) for c in table.columns if c.info.get("pinned")]


def _wrap(items: Iterable[str], indent: int = 12) -> str:
    """A comma-separated list on lines of its own, indented, broken between items before 100
    columns."""
    lines: list[str] = []
    line = ""
    for item in items:
        if line and indent + len(line) + len(item) + 2 > 99:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    return "".join(f"\n{' ' * indent}{x}" for x in lines)


def _function(name: str, args: str, returns: str, body: str) -> Unit:
    signature = ", ".join(a.split()[1] for a in args.split(", "))
    sql = (
        f"CREATE OR REPLACE FUNCTION {name}({args})\n"
        f"RETURNS {returns} LANGUAGE plpgsql AS $fn$\nBEGIN\n{body}\nEND $fn$;\n"
        f"REVOKE ALL ON FUNCTION {name}({signature}) FROM PUBLIC;\n"
        f"GRANT EXECUTE ON FUNCTION {name}({signature}) TO {APP_ROLE};\n"
    )
    return Unit(name, signature, sql)


def _insert(table: Table, source: str) -> str:
    columns = written_columns(table)
    return (
        f"    INSERT INTO {table.name} ({_wrap(columns)})\n"
        f"        SELECT{_wrap(columns)}\n"
        f"        FROM {source}(NULL::{table.name}, doc)"
    )


def _run_units(runs: Table) -> list[Unit]:
    key = next(
        c for c in runs.constraints if isinstance(c, UniqueConstraint) and c.name == RUN_IDEMPOTENCY
    )
    conflict = ", ".join(str(c.name) for c in key.columns)
    insert = _function(
        f"runcontrol_insert_{runs.name}",
        "doc jsonb",
        "boolean",
        f"{_insert(runs, 'jsonb_populate_record')}\n"
        f"        ON CONFLICT ({conflict}) DO NOTHING;\n    RETURN FOUND;",
    )
    keys, pins = _primary_key(runs), _pinned(runs)
    changed = [c for c in written_columns(runs) if c not in keys and c not in pins]
    # The row by its key read from the document, not joined to the record: a join let the
    # planner scan the tenant's runs (row-level security's predicate) and build the record
    # once per row it met, in a plan cached while the table was small (issue 33).
    match = " AND ".join(
        f"{runs.name}.{k} = CAST(doc->>'{k}' AS {runs.c[k].type.compile(dialect=_DIALECT)})"
        for k in keys
    )
    update = _function(
        f"runcontrol_update_{runs.name}",
        "doc jsonb, expected_version bigint",
        "boolean",
        f"    UPDATE {runs.name} SET{_wrap(f'{c} = r.{c}' for c in changed)}\n"
        f"        FROM jsonb_populate_record(NULL::{runs.name}, doc) r\n"
        f"        WHERE {match} AND {runs.name}.{RUN_VERSION} = expected_version;\n"
        "    RETURN FOUND;",
    )
    # each column only if the document carries it: CASE keeps the stored value otherwise
    kept = (f"{c} = CASE WHEN doc ? '{c}' THEN r.{c} ELSE {runs.name}.{c} END" for c in changed)
    patch = _function(
        f"runcontrol_patch_{runs.name}",
        "doc jsonb, expected_version bigint",
        "boolean",
        f"    UPDATE {runs.name} SET{_wrap(kept)}\n"
        f"        FROM jsonb_populate_record(NULL::{runs.name}, doc) r\n"
        f"        WHERE {match} AND {runs.name}.{RUN_VERSION} = expected_version;\n"
        "    RETURN FOUND;",
    )
    return [insert, update, patch, _pins_unit(runs, pins)]


def _pins_unit(runs: Table, pins: Sequence[str]) -> Unit:
    name = "runcontrol_keep_run_pins"
    changed = "\n            OR ".join(f"NEW.{p} IS DISTINCT FROM OLD.{p}" for p in pins)
    listed = ", ".join(pins)
    sql = (
        f"CREATE OR REPLACE FUNCTION {name}()\n"
        "RETURNS trigger LANGUAGE plpgsql AS $fn$\nBEGIN\n"
        f"    IF {changed} THEN\n"
        "        RAISE EXCEPTION 'a run''s pins never change after acceptance (%)',\n"
        f"            '{listed}'\n            USING ERRCODE = 'insufficient_privilege';\n"
        "    END IF;\n    RETURN NEW;\nEND $fn$;\n"
        f"CREATE OR REPLACE TRIGGER {runs.name}_keep_pins BEFORE UPDATE\n"
        f"    OF {listed}\n    ON {runs.name} FOR EACH ROW EXECUTE FUNCTION {name}();\n"
    )
    return Unit(name, "", sql)


def _table_unit(table: Table) -> Unit:
    statement = _insert(table, "jsonb_populate_recordset")
    if table.name not in INSERT_ONLY_TABLES:
        keys = _primary_key(table)
        changed = [c for c in written_columns(table) if c not in keys]
        statement += (
            f"\n        ON CONFLICT ({', '.join(keys)}) DO UPDATE SET"
            f"{_wrap(f'{c} = EXCLUDED.{c}' for c in changed)}"
        )
    return _function(
        f"runcontrol_write_{table.name}", "doc jsonb", "boolean", statement + ";\n    RETURN FOUND;"
    )


def _patch_unit(table: Table) -> Unit:
    """``runcontrol_patch_<table>(rows)`` (issue 42): each row by its key, only the columns
    its object carries (the others keep their stored values: ``store/lean.py``)."""
    keys = _primary_key(table)
    changed = [c for c in written_columns(table) if c not in keys]
    kept = (
        f"{c} = CASE WHEN e.value ? '{c}' THEN r.{c} ELSE {table.name}.{c} END" for c in changed
    )
    match = " AND ".join(f"{table.name}.{k} = r.{k}" for k in keys)
    return _function(
        f"runcontrol_patch_{table.name}",
        "doc jsonb",
        "boolean",
        f"    UPDATE {table.name} SET{_wrap(kept)}\n"
        "        FROM jsonb_array_elements(doc) AS e\n"
        f"        CROSS JOIN LATERAL jsonb_populate_record(NULL::{table.name}, e.value) AS r\n"
        f"        WHERE {match};\n    RETURN FOUND;",
    )


def _append_unit(table: Table) -> Unit:
    columns = written_columns(table)
    rows = (
        f"jsonb_populate_recordset(NULL::{table.name}, CASE jsonb_typeof(d.doc->key)\n"
        "            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)"
    )
    statement = (
        f"    INSERT INTO {table.name} ({_wrap(columns)})\n"
        f"        SELECT{_wrap(columns)}\n"
        "        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)\n"
        f"        CROSS JOIN LATERAL {rows}\n"
        "            WITH ORDINALITY AS r\n"
        "        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant\n"
        "        ORDER BY d.place, r.ordinality;\n    RETURN FOUND;"
    )
    return _function(
        f"runcontrol_append_{table.name}",
        "docs jsonb, applied int[], key text, tenant text",
        "boolean",
        statement,
    )


def render(target: MetaData = metadata) -> list[Unit]:
    """Every writer, as the table definitions make it today."""
    return [
        *_run_units(target.tables["runs"]),
        *(_table_unit(target.tables[name]) for name in WRITTEN),
        *(_patch_unit(target.tables[name]) for name in PATCHED),
        *(_append_unit(target.tables[name]) for name in GROUP_APPENDED),
    ]
