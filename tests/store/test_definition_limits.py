"""The database's side of publication's limits (issue 34): the check constraints on the
catalog's ids are the ones ``store/tables.py`` derives from ``domain/limits.py``, and the
integer columns a step's ``maxAttempts`` lands in hold every value publication accepts."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, text

from runcontrol.domain import limits
from runcontrol.store.tables import metadata


def test_the_catalog_checks_are_the_limits(owner_engine):
    declared = {
        c.name: str(c.sqltext)
        for table in metadata.tables.values()
        for c in table.constraints
        if isinstance(c, CheckConstraint)
    }
    workflow_id = f"char_length(workflow_id) BETWEEN 1 AND {limits.MAX_WORKFLOW_ID}"
    assert declared == {
        "ck_releases_workflow_id": workflow_id,
        "ck_release_aliases_workflow_id": workflow_id,
        "ck_release_aliases_alias": f"char_length(alias) BETWEEN 1 AND {limits.MAX_NAME}",
    }
    with owner_engine.connect() as conn:
        found = dict(
            conn.execute(
                text(
                    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                    " WHERE contype = 'c' AND conname LIKE 'ck\\_%'"
                )
            ).all()
        )
    for name, check in declared.items():
        column, low_high = check.removeprefix("char_length(").split(") BETWEEN ")
        low, high = low_high.split(" AND ")
        assert found[name] == (
            f"CHECK (((char_length({column}) >= {low}) AND (char_length({column}) <= {high})))"
            " NOT VALID"
        ), found


def test_max_attempts_fits_the_integer_columns_it_lands_in(owner_engine):
    with owner_engine.connect() as conn:
        types = dict(
            conn.execute(
                text(
                    "SELECT table_name || '.' || column_name, data_type"
                    " FROM information_schema.columns WHERE (table_name, column_name)"
                    " IN (('steps', 'max_attempts'), ('attempts', 'number'))"
                )
            ).all()
        )
        assert types == {"steps.max_attempts": "integer", "attempts.number": "integer"}
        assert conn.execute(text("SELECT CAST(:n AS integer)"), {"n": limits.MAX_ATTEMPTS})
    assert limits.MAX_ATTEMPTS <= limits.INT4_MAX
