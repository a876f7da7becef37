"""The baseline: the schema migrations 0001..0029 built, squashed into one (pre-release).

The roles come first (their password from the configuration, ``RUNCONTROL_APP_ROLE_PASSWORD``),
then ``0029_schema.sql`` (the tables, indexes, row-level security and grants), then every
function by name (``FUNCTIONS``: ``runcontrol/store/sql/`` and the writers rendered from
``tables.py``; ``runcontrol/store/functions.py``), then ``0029_triggers.sql`` (which execute
some of them). It keeps revision id 0029, so a database already at 0029 upgrades on as before;
one at an older revision is not upgraded (docs/operations.md).

The squash left the schema as it was: a database migrated from empty by the chain before it
(commit 4b592df) and one migrated by this baseline have the same ``pg_dump --schema-only``, but
for the five functions the old chain renamed and no longer called (``runcontrol_apply_0014`` ..
``runcontrol_apply_0026``), which a database made by the baseline does not have (and one
migrated before keeps, unused).

Revision ID: 0029
"""

from __future__ import annotations

from pathlib import Path

from alembic import context, op

from runcontrol.store.functions import apply

revision = "0029"
down_revision = None
branch_labels = None
depends_on = None

HERE = Path(__file__).resolve().parent.parent
ROLES = {
    "runcontrol_app": "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB",
    "runcontrol_system": "LOGIN NOSUPERUSER BYPASSRLS NOCREATEROLE NOCREATEDB",
}
# What it applies, by name: each one's digest as of this revision.
FUNCTIONS = {
    "runcontrol_append_output": "dc228cfe2d8372e3d0df8e884484ffe2",
    "runcontrol_append_rows": "09a3159184d43d8cb354e1614f0ca943",
    "runcontrol_apply": "773049f4cbc20703b8032f15f0fa45e9",
    "runcontrol_apply_document": "2ce5443f9ea1ee4ef60b6de3ce33eed5",
    "runcontrol_apply_each": "001c9f97d887eac917a8401f0ea7b050",
    "runcontrol_apply_many": "d74f7fa2f5953dba4115de0d070b4cc1",
    "runcontrol_check_capacity": "7d421dd28503539ae0f28cca2e15d9bf",
    "runcontrol_config_changed": "61ed8673278b22e2187d4d15d6836137",
    "runcontrol_flow_admit": "c54e0a2e1ecf19b804f565ee164b7bf4",
    "runcontrol_flow_attempt_settled": "95d1113403125d4f11755999a062670a",
    "runcontrol_flow_lock": "e7430cfdfc0c3957c737e389695caf14",
    "runcontrol_flow_promote": "017971f69f35f658c59860c476a51121",
    "runcontrol_flow_run_ended": "c3cc188944930d7beb27131a6bd6e458",
    "runcontrol_flow_wait": "04eae5bdf076b5ec2efb1e65cb728c56",
    "runcontrol_forbid_mutation": "9a4c89488473ba8348f6aa35ffbd119c",
    "runcontrol_listen": "3ef4baf9eafb21598063336ab299bf09",
    "runcontrol_listened": "2abbbc93e58d88f488b896bab4afc2ca",
    "runcontrol_notify_due": "7a32954d21d6436edf76b80dc57b8419",
    "runcontrol_purge_journal": "07f33bd560fc9d9e108fde517e2ce82d",
    "runcontrol_rate_consume": "3d97a9072363e827b473e5525e93bb6f",
    "runcontrol_rate_reserve": "1f4a268088a7179200b7a91d720b7129",
    "runcontrol_release_budget": "bba063f71cce00fcac776f504f71aae1",
    "runcontrol_reserve_budget": "198f0be7d1749d5beac315c51e464cec",
    "runcontrol_template_use": "4014ea676560bb5df4d0db976b9b3757",  # its trigger: 0035
    "runcontrol_unlisten": "36abbb742b6933e870b15ff6e9672fc3",
    "runcontrol_insert_runs": "f95c8f25ecfa3d07896858564f67d43f",
    "runcontrol_update_runs": "af2f537fbfac90a09afa2588fc0a5ab8",
    "runcontrol_patch_runs": "edb71bf2789fae7e05097d1948d0d4f4",
    "runcontrol_keep_run_pins": "eda051c731355d625ccbd07e00bad6c0",
    "runcontrol_write_steps": "3c45d3b947412fdb7acf4d3690e2c932",
    "runcontrol_write_attempts": "421154a7ecb63ca52080f52c11707a46",
    "runcontrol_write_attempt_results": "fbee727432c02b2b1153eb97611046e0",
    "runcontrol_write_journaled_calls": "07c8e46d8b59bb67d0f4afb8662e583d",
    "runcontrol_write_leases": "7fee8a810cf5d8460b76386539a84659",
    "runcontrol_write_tool_calls": "63279b9b6ef34600a3e850caeac3bfca",
    "runcontrol_write_approval_requests": "8daad4ad5b0632d92de74bacbaa0dbee",
    "runcontrol_write_approval_decisions": "871e50588a30c565cd1d00b95dc4c6df",
    "runcontrol_write_cancellation_intents": "051633e9eb2c3a19aaab036b9abe3c8c",
    "runcontrol_write_outbox": "98a8000844ae491661a3142b18ef6c04",
    "runcontrol_write_recovery_journal": "0c690081659b13343931bef6411060c7",
    "runcontrol_write_audit_log": "1a8139dd2b052ecf70c9935a71d5bdb7",
    "runcontrol_write_command_answers": "feb6587150e764db57b1ef5bdd56556d",
    "runcontrol_append_outbox": "b6925651c2bac980e2a7e7964ebe39e4",
    "runcontrol_append_recovery_journal": "33cf1669fc9149b752f68c593f82521f",
    "runcontrol_append_audit_log": "282386078cf4e170e490bb0b65df4187",
    "runcontrol_append_command_answers": "75b0f2fa03fe84cde12895f48f7657f1",
    "runcontrol_append_attempt_results": "d9b67b8a20cca275b9a0435a70db5234",
    "runcontrol_check_fence": "2ee75f1464ec5898a6e250e89bbf0a3e",
}


def _ensure_role(name: str, attributes: str, password: str | None) -> None:
    # Roles are cluster-wide: a second database on the same server finds them made.
    op.execute(
        f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}') THEN
                CREATE ROLE {name} {attributes};
            END IF;
        END $$"""
    )
    op.execute(f"ALTER ROLE {name} {attributes}")
    if password:
        escaped = password.replace("'", "''")
        op.execute(f"ALTER ROLE {name} PASSWORD '{escaped}'")


def upgrade() -> None:
    password = context.config.attributes.get("role_password")
    for name, attributes in ROLES.items():
        _ensure_role(name, attributes, password)
    database = op.get_bind().exec_driver_sql("SELECT current_database()").scalar()
    op.execute(f"GRANT CONNECT ON DATABASE {database} TO {', '.join(ROLES)}")
    op.execute((HERE / "0029_schema.sql").read_text())
    # The table today's fence check reads (0034's; today's functions are applied here).
    op.execute((HERE / "0034_shard_fences.sql").read_text())
    apply(FUNCTIONS)
    op.execute((HERE / "0029_triggers.sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("the baseline has no downgrade")
