"""The directory of virtual shards (issue 41; docs/sharding.md): ``vshards`` (the 1,024 virtual
shards, each on a database), ``tenant_placement`` (a tenant's virtual shard, where one is set;
the tenant's own rows: row-level security, the app role reads only) and ``directory_version``
(one row, bumped with any change). Seeds every virtual shard on database 0, the one database
there is, so the directory is complete from the start: an absent shard is an error, never a
default. No function changed (the layout of ``make sql``'s revision, with an empty
``FUNCTIONS``).

Revision ID: 0031
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

# Only adds tables nothing of the previous release reads or writes.
oldest_code = "0030"

FUNCTIONS: dict[str, str] = {}

TABLES = """
CREATE TABLE vshards (
    vshard integer NOT NULL,
    database integer NOT NULL,
    epoch bigint NOT NULL,
    state text NOT NULL,
    CONSTRAINT vshards_pkey PRIMARY KEY (vshard)
);
INSERT INTO vshards (vshard, database, epoch, state)
    SELECT v, 0, 0, 'serving' FROM generate_series(0, 1023) AS v;
CREATE TABLE tenant_placement (
    tenant_id text NOT NULL,
    vshard integer NOT NULL,
    CONSTRAINT tenant_placement_pkey PRIMARY KEY (tenant_id)
);
ALTER TABLE tenant_placement ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_placement FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_placement
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
CREATE TABLE directory_version (version bigint NOT NULL);
INSERT INTO directory_version (version) VALUES (1);
GRANT SELECT ON vshards, tenant_placement, directory_version TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON vshards, tenant_placement, directory_version
    TO runcontrol_system;
"""


def upgrade() -> None:
    op.execute(TABLES)
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0031 has no downgrade: restore from a backup taken before it")
