"""Functions changed since 0037: runcontrol_update_runs, runcontrol_patch_runs,
runcontrol_keep_run_pins, applied by name as
``runcontrol/store/sql/`` and ``store/writers.py`` make them today (written by ``make sql``).
A run's template (``template_id``, ``template_version``, 0032) and a replay's original and
options (``replay_of``, ``replay``, 0037) are pinned: written at acceptance, left out of the
run's update and patch, and the pins' trigger refuses a change of any of them (invariant 2).
The baseline's SQL now creates the four columns (0032 and 0037 add them only if missing), so
its trigger can name them.

Revision ID: 0038
"""

from __future__ import annotations

from runcontrol.store.functions import apply

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

# The previous release's documents apply as before: they never change these columns.
oldest_code = "0036"

FUNCTIONS = {
    "runcontrol_update_runs": "af2f537fbfac90a09afa2588fc0a5ab8",
    "runcontrol_patch_runs": "edb71bf2789fae7e05097d1948d0d4f4",
    "runcontrol_keep_run_pins": "5b63491ef8ccb35611f46452c5245176",
}


def upgrade() -> None:
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0038 has no downgrade: restore from a backup taken before it")
