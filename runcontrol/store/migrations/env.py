"""Alembic environment: migrations run on a connection handed over by runcontrol.store.migrate."""

from __future__ import annotations

from alembic import context

from runcontrol.store.tables import metadata

config = context.config
connection = config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
