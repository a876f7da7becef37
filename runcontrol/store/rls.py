"""Row-level security, derived from the tables (invariant 9): ``tables.tenant_table`` marks each
tenant table with the policies it has, and ``statements`` renders them as the migrations write
them. ``tests/store/test_tenant_isolation.py`` checks that the migrated database has exactly
these: a tenant table without its policy, or a policy no table marks, fails there."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import MetaData, Table

POLICIES = "policies"  # the key of a tenant table's ``info`` that lists its policies


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    terms: str  # what follows ``CREATE POLICY name ON table``

    def sql(self, table: str) -> str:
        return f"CREATE POLICY {self.name} ON {table}\n    {self.terms};"


_TENANT = "tenant_id = current_setting('runcontrol.tenant_id', true)"
# Every tenant table's: the tenant's rows only, for every role but the system role (BYPASSRLS).
TENANT_ISOLATION = Policy("tenant_isolation", f"USING ({_TENANT})\n    WITH CHECK ({_TENANT})")
_PROJECT = "coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id)"
# A caller bound to a project: its project's rows only, to read (no write depends on it; unset,
# it restricts nothing)...
PROJECT_READS = Policy(
    "project_scope", f"AS RESTRICTIVE FOR SELECT TO runcontrol_app\n    USING ({_PROJECT})"
)
# ... or to read and change (schedules, 0023).
PROJECT_ROWS = Policy("project_scope", f"AS RESTRICTIVE TO runcontrol_app\n    USING ({_PROJECT})")
# The system role's retention purge of the journal (the one DELETE on an append-only table).
RETENTION_PURGE = Policy(
    "retention_purge",
    "FOR DELETE\n    USING (current_setting('runcontrol.retention_purge', true) = 'on')",
)


def policies(table: Table) -> tuple[Policy, ...]:
    """The policies ``table`` is marked with (none: not a tenant table)."""
    marked: tuple[Policy, ...] = table.info.get(POLICIES, ())
    return marked


def table_statements(table: Table) -> list[str]:
    """RLS on, forced (the owner too), and the table's policies: as the migrations write them."""
    if not policies(table):
        return []
    return [
        f"ALTER TABLE {table.name} ENABLE ROW LEVEL SECURITY;",
        f"ALTER TABLE {table.name} FORCE ROW LEVEL SECURITY;",
        *(policy.sql(table.name) for policy in policies(table)),
    ]


def statements(target: MetaData) -> str:
    """The RLS statements of every marked table of ``target``."""
    return "\n".join(s for table in target.tables.values() for s in table_statements(table)) + "\n"
