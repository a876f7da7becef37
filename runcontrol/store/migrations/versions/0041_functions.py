"""Outcome reports answered from their result rows (issue 42; docs/write-path.md): an
``attempt_results`` row names the ``ReportOutcome`` that stored it (``command_id``) and what it
asked (``fingerprint``), so that report writes no ``command_answers`` row: a resend is answered
with its attempt as stored, and a reused id for another command is refused, as from an answer
row. The writers ``runcontrol_write_attempt_results`` and ``runcontrol_append_attempt_results``
write the two columns; applied by name as ``runcontrol/store/sql/`` and ``store/writers.py``
make them today (written by ``make sql``).

The previous release's documents apply as before (their rows leave both NULL) and its answers
stay readable: a report it answered keeps its ``command_answers`` row. Its hosts do not read the
new columns: a resend of a report this release answered, meeting one of them, is decided again,
and the settled attempt answers the same report with itself (``report_outcome``'s retried report,
no effect) and refuses another one (``OutcomeAlreadyRecorded``).

Revision ID: 0041
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None

# Two nullable columns and writers that also write them: the previous releases' documents and
# reads work as before (see above).
oldest_code = "0038"

FUNCTIONS = {
    "runcontrol_write_attempt_results": "6381bebc4aae14290cf920bd10b2d2b0",
    "runcontrol_append_attempt_results": "9375d62bb4168138a94dcf926c29b836",
}


def upgrade() -> None:
    op.execute(
        "ALTER TABLE attempt_results ADD COLUMN command_id TEXT, ADD COLUMN fingerprint TEXT"
    )
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0041 has no downgrade: restore from a backup taken before it")
