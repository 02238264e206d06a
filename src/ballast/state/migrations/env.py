"""Alembic runs here on the connection Ballast hands it (see ballast.state.db.upgrade)."""

from alembic import context

from ballast.state.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
